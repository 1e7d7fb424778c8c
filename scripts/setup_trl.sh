#!/usr/bin/env bash
# Idempotent set-up of .venv-trl for benchmarks/vs_trl.py: Hugging Face TRL in its own
# environment (no agentrl in it), with the CPU torch wheel agentrl pins and reasoning-gym for
# the task generator. The benchmark runs this itself.
set -euo pipefail
VENV="${VENV_TRL:-.venv-trl}"
PYTHON="${PYTHON:-python3}"
TRL_VERSION="${TRL_VERSION:-1.16.0}"
STAMP="$VENV/.agentrl-trl-installed"

if [ -f "$STAMP" ] && [ "$STAMP" -nt scripts/setup_trl.sh ]; then
    exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
start=$(date +%s)
# the CPU torch wheel is served locally (find-links); naming it keeps pip off CUDA builds
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    "torch==2.13.0" "trl==$TRL_VERSION" "reasoning-gym>=0.1.19" "rich>=13" 2>&1 \
    | { grep -v -e "is ignored: it is neither a file nor a directory" || true; }
"$VENV/bin/python" -c "import trl, torch; print('[setup-trl] trl', trl.__version__, 'torch', torch.__version__)"
echo "[setup-trl] done in $(( $(date +%s) - start )) s"
touch "$STAMP"
