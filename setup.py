"""Package discovery (the rest of the metadata is in pyproject.toml).

Packages are found, not listed, so a new subpackage cannot be left out of the wheel;
scripts/wheel_check.sh builds the wheel and checks it.
"""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["agentrl", "agentrl.*"]))
