"""Package discovery (the rest of the metadata is in pyproject.toml).

envs/, tools/ and sandbox/ live at the top of the repository but install as agentrl.envs,
agentrl.tools and agentrl.sandbox. Packages are found, not listed, so a new subpackage
cannot be left out of the wheel; scripts/wheel_check.sh builds the wheel and checks it.
"""

from setuptools import find_packages, setup

MAPPED = {"agentrl.envs": "envs", "agentrl.tools": "tools", "agentrl.sandbox": "sandbox"}

packages = find_packages(include=["agentrl", "agentrl.*"])
for name, folder in MAPPED.items():
    packages += [name, *(f"{name}.{sub}" for sub in find_packages(folder))]

setup(packages=packages, package_dir={"agentrl": "agentrl", **MAPPED})
