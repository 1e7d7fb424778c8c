#!/usr/bin/env bash
# Idempotent set-up of the coding-agent harnesses that `env.name: agent` runs unchanged
# (docs/gateway.md, "Harnesses"): mini-swe-agent in its own venv (.venv-harness: its LiteLLM
# and pins stay out of agentrl's), and the npm CLIs pinned into .harnesses/node_modules.
# Needs python3 and npm (Debian: apt-get install nodejs npm); `make setup-harnesses` runs it.
set -euo pipefail
VENV="${VENV_HARNESS:-.venv-harness}"
PREFIX="${HARNESS_PREFIX:-.harnesses}"
PYTHON="${PYTHON:-python3}"
# pinned: the versions the integration tests ran against (README, "Harnesses")
MINI_SWE_AGENT="mini-swe-agent==2.4.6"
NPM_PACKAGES=(opencode-ai@1.18.33 @anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0)
STAMP="$PREFIX/.agentrl-harnesses-installed"

if [ -f "$STAMP" ] && [ "$STAMP" -nt scripts/setup_harnesses.sh ]; then
    exit 0
fi
start=$(date +%s)

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$MINI_SWE_AGENT" 2>&1 \
    | { grep -v -e "is ignored: it is neither a file nor a directory" || true; }
"$VENV/bin/mini" --help </dev/null >/dev/null

if ! command -v npm >/dev/null 2>&1; then
    # no stamp: the next run installs them once npm is there
    echo "[setup-harnesses] npm not found: apt-get install nodejs npm; OpenCode, Claude Code" \
        "and Codex are not installed (their tests skip)" >&2
    exit 0
fi
mkdir -p "$PREFIX"
# --ignore-scripts is not used: claude-code and codex pick their platform binary in optional deps
npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error "${NPM_PACKAGES[@]}"
for bin in opencode claude codex; do
    [ -x "$PREFIX/node_modules/.bin/$bin" ] || { echo "[setup-harnesses] $bin missing" >&2; exit 1; }
done
echo "[setup-harnesses] done in $(( $(date +%s) - start )) s"
touch "$STAMP"
