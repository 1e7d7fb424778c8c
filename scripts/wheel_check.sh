#!/usr/bin/env bash
# The package as a user installs it: build the wheel from the repository's files, install it
# into a scratch venv that cannot see the source tree, and use it from outside the repo.
#
#   1. the wheel holds every module and data file of agentrl/
#   2. core only: the venv sees the wheel and the closure of its core requirements (linked
#      from .venv's site-packages; no extras): every module imports or raises the one-line
#      MissingExtra naming its extra; `agentrl --help`; a 1-step tiny-model `agentrl train`
#   3. with every extra (.venv's site-packages behind it): every module imports
#
# .venv's own agentrl (an editable install) never loads: its finder is started by a .pth
# file, and .pth files run only in the venv's own site-packages. Called by `make wheel-check`
# and .ci/run; about a minute on 2 cores.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$(cd "${VENV:-$REPO/.venv}" && pwd)"  # absolute: the checks below run from elsewhere
PY="$VENV/bin/python"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/agentrl-wheel.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
say() { echo "[wheel-check] $*"; }
start=$SECONDS

# 1. the wheel, from the files git knows (tracked, and new ones not ignored): no build/ or
# egg-info left over from an editable install leaks into it
mkdir -p "$WORK/src"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
    | xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' _ \
    | xargs -0 -r cp --parents -t "$WORK/src")
"$PY" -m pip wheel -q --no-deps --no-build-isolation --disable-pip-version-check \
    -w "$WORK/dist" "$WORK/src" >/dev/null
WHEEL="$(ls "$WORK"/dist/agentrl-*.whl)"
say "built $(basename "$WHEEL")"
"$PY" "$REPO/scripts/wheel_check.py" contents "$WHEEL" "$WORK/src"

# 2. a scratch venv with the wheel and the core's dependencies only
"$PY" -m venv --without-pip "$WORK/venv"
SITE="$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$PY" -m pip --python "$WORK/venv/bin/python" install -q --no-deps --no-index \
    --disable-pip-version-check "$WHEEL"
"$PY" "$REPO/scripts/wheel_check.py" core-deps "$WHEEL" "$WORK/core"
echo "$WORK/core" > "$SITE/agentrl_wheel_check_core.pth"

mkdir -p "$WORK/cwd"
cp "$REPO/scripts/wheel_check.py" "$WORK/cwd/"
cd "$WORK/cwd"  # outside the repository: nothing of the source tree on sys.path
run() { env -u PYTHONPATH -u PYTHONHOME PYTHONNOUSERSITE=1 "$@"; }
run "$WORK/venv/bin/python" wheel_check.py walk core "$REPO"
run "$WORK/venv/bin/agentrl" --help >"$WORK/help.txt"
grep -q "train" "$WORK/help.txt" || { cat "$WORK/help.txt"; say "agentrl --help lists no train"; exit 1; }
say "agentrl --help works"

# one step on the random tiny model, tasks from a file (code_math's python tool, the sandbox)
printf '{"question": "What is 2 + 3?", "answer": "5"}\n{"question": "What is 7 * 6?", "answer": "42"}\n' \
    >"$WORK/tasks.jsonl"
cat >"$WORK/tiny.yaml" <<EOF
model: {name: tiny-llama, dtype: float32}
sampler: {max_new_tokens: 8, max_batch_size: 4}
env: {name: code_math, options: {dataset_path: "$WORK/tasks.jsonl"}}
rollout: {group_size: 2, concurrency: 4, max_turns: 1, max_tokens: 1024}
learner: {batch_groups: 1, micro_batch_size: 2}
orchestrator: {max_steps: 1, max_staleness: 0, checkpoint_every: 0}
logging: {progress: false}
EOF
run "$WORK/venv/bin/agentrl" train "$WORK/tiny.yaml" --run-dir "$WORK/run" >"$WORK/train.log" 2>&1 \
    || { tail -40 "$WORK/train.log"; say "the 1-step agentrl train failed"; exit 1; }
grep -q '"event": "BatchTrained"' "$WORK/run/metrics.jsonl" \
    || { tail -40 "$WORK/train.log"; say "the run trained no step"; exit 1; }
grep -q "pip install 'agentrl\[plots\]'" "$WORK/train.log" \
    || { tail -20 "$WORK/train.log"; say "the summary did not name the plots extra"; exit 1; }
say "a 1-step tiny-model agentrl train ran from the wheel (core dependencies only)"

# 3. every extra installed
"$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
    >"$SITE/agentrl_wheel_check_extras.pth"
run "$WORK/venv/bin/python" wheel_check.py walk all "$REPO"
say "passed in $((SECONDS - start)) s"
