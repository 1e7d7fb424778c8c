#!/usr/bin/env bash
# Rehearse the GPU check on a CPU (issue 38): a Python venv that plays the GPU image (torch,
# transformers & co installed in a venv; none of pydantic & co), the bundle's wheels carried in
# the working tree, then scripts/gpu_check.sh --rehearse in it: setup from the wheels with no
# index, imports, collection of tests/gpu, and every benchmark section at tiny shapes. Any setup
# failure the GPU run would meet shows up here first. `make gpu-rehearsal`; .ci/run runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=.gpu-rehearsal
IMAGE="$ROOT/image"
PY="${PYTHON:-python3}"
# the GPU image's packages (scripts/gpu_check.sh IMAGE), at .venv's versions; torch is the
# CPU build served locally (the image's CUDA build is what the GPU run uses)
pkgs=(transformers peft safetensors anyio httpx typer rich pyyaml pytest numpy)
if [ ! -x "$IMAGE/bin/python" ] || ! "$IMAGE/bin/python" -c "import torch, transformers" 2>/dev/null; then
    rm -rf "$IMAGE"
    "$PY" -m venv "$IMAGE"
    pins=()
    for dist in "${pkgs[@]}"; do
        pins+=("$dist==$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$dist'))")")
    done
    "$IMAGE/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0" "${pins[@]}"
fi
# back to the image's state: whatever an earlier rehearsal installed goes
"$IMAGE/bin/python" -m pip uninstall -q -y agentrl pydantic pydantic-core annotated-types \
    typing-inspection pytest-timeout 2>/dev/null || true
if "$IMAGE/bin/python" -c "import pydantic" 2>/dev/null; then
    echo "[rehearsal] the image venv has pydantic: it no longer plays the GPU image" >&2; exit 1
fi
# the GPU's bundle (CPython 3.12: pydantic-core must be a cp312 wheel) and one for this Python
bash scripts/gpu_check.sh --bundle
here=$("$IMAGE/bin/python" -c "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
GPU_BUNDLE="$ROOT/bundle-$here" GPU_PYTHON_VERSION="$here" bash scripts/gpu_check.sh --bundle
GPU_BUNDLE="$ROOT/bundle-$here" PYTHON="$IMAGE/bin/python" \
    bash scripts/gpu_check.sh --rehearse --out "$ROOT/out" "$@"
