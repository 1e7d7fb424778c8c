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
reset_image() {  # back to the image's state: whatever an earlier setup installed goes
    "$IMAGE/bin/python" -m pip uninstall -q -y agentrl pydantic pydantic-core annotated-types \
        typing-inspection pytest-timeout 2>/dev/null || true
    if "$IMAGE/bin/python" -c "import pydantic" 2>/dev/null; then
        echo "[rehearsal] the image venv has pydantic: it no longer plays the GPU image" >&2; exit 1
    fi
}
expect_setup_failure() {  # what, the text the failure must show; then gpu_check's environment
    local what="$1" text="$2" log="$ROOT/control.log"
    shift 2
    if env "$@" bash scripts/gpu_check.sh --setup-only --out "$ROOT/control" >"$log" 2>&1; then
        echo "[rehearsal] negative control FAILED: the setup passed with $what; the rehearsal" \
            "would no longer catch it (log: $log)" >&2
        exit 1
    fi
    grep -q -- "$text" "$log" || {
        echo "[rehearsal] negative control FAILED: the setup failed with $what, but without" \
            "'$text' (log: $log)" >&2
        exit 1
    }
    echo "[rehearsal] negative control ok: $what fails the setup ('$text')"
}
# the GPU's bundle (CPython 3.12: pydantic-core must be a cp312 wheel) and one for this Python
bash scripts/gpu_check.sh --bundle
here=$("$IMAGE/bin/python" -c "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
GPU_BUNDLE="$ROOT/bundle-$here" GPU_PYTHON_VERSION="$here" bash scripts/gpu_check.sh --bundle

# Negative controls: the two setup failures issue 38 found must still fail the setup here.
# 1. a wheel missing from the bundle (no index on the GPU machine: pip cannot fetch it)
reset_image
rm -rf "$ROOT/bundle-missing"
cp -a "$ROOT/bundle-$here" "$ROOT/bundle-missing"
rm -f "$ROOT"/bundle-missing/wheels/pydantic_core-*.whl
expect_setup_failure "pydantic-core missing from the bundle" "pydantic-core" \
    GPU_BUNDLE="$ROOT/bundle-missing" PYTHON="$IMAGE/bin/python"
rm -rf "$ROOT/bundle-missing"
# 2. a venv nested in the image's venv (--system-site-packages sees the base interpreter's
#    packages, not the image venv's: torch vanishes)
reset_image
rm -rf "$ROOT/nested"
"$IMAGE/bin/python" -m venv --system-site-packages "$ROOT/nested"
expect_setup_failure "a venv nested in the image's venv" "has no torch/transformers" \
    GPU_BUNDLE="$ROOT/bundle-$here" PYTHON="$ROOT/nested/bin/python"
rm -rf "$ROOT/nested" "$ROOT/control"

# the rehearsal itself: the image's state, this Python's bundle, every section at tiny shapes
reset_image
GPU_BUNDLE="$ROOT/bundle-$here" PYTHON="$IMAGE/bin/python" \
    bash scripts/gpu_check.sh --rehearse --out "$ROOT/out" "$@"
