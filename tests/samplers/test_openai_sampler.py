"""The openai sampler against a real `vllm serve` on 127.0.0.1 (run in .venv-vllm).

One server for the module, started with VLLM_SERVER_DEV_MODE=1 so the reload endpoints
exist, and `--logprobs-mode processed_logprobs` so log-probs match our definition.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
pytest.importorskip("vllm", reason="needs .venv-vllm (make test-vllm)")

import httpx  # noqa: E402
import torch  # noqa: E402
from anyio.from_thread import start_blocking_portal  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from agentrl.errors import PromptError, SamplerError, WeightUpdateError  # noqa: E402
from agentrl.models import resolve_model_dir  # noqa: E402
from agentrl.samplers.base import SamplingParams  # noqa: E402
from agentrl.samplers.openai_compat import OpenAISampler  # noqa: E402
from agentrl.samplers.vllm_cpu import configure_cpu_env  # noqa: E402
from agentrl.samplers.vllm_worker import WORKER_EXTENSION  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

SERVED = "smollm2"
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return resolve_model_dir("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    port = _free_port()
    configure_cpu_env()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    log = tmp_path_factory.mktemp("vllm-serve") / "serve.log"
    # (the `vllm` console script looks up the `vllm` distribution, which vllm-cpu is not)
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED,
        "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
        "--logprobs-mode", "processed_logprobs", "--max-num-seqs", "16",
        "--worker-extension-cls", WORKER_EXTENSION,
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            try:
                return httpx.get(f"{url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        def exited() -> str | None:
            if proc.poll() is None:
                return None
            return f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}"

        wait_until(healthy, "vllm serve healthy", timeout=600, interval=1.0, abort=exited)
        yield url
    finally:
        # the server and its engine processes share the session we started
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def portal():
    with start_blocking_portal(backend="asyncio") as p:
        yield p


@pytest.fixture
def sampler(server, portal, model_dir):
    s = portal.call(lambda: _make(server, model_dir, reload_endpoint=True))
    yield s
    portal.call(s.close)


async def _make(url, model_dir, **kw):
    return OpenAISampler(base_url=url, model_dir=model_dir, **kw)


def test_token_ids_and_logprobs_match_hf(sampler, portal, model_dir):
    from transformers import AutoModelForCausalLM

    tok = sampler.tokenizer
    prompt = tok("The capital of France is")["input_ids"]
    params = SamplingParams(temperature=0.8, max_new_tokens=24, seed=7, return_entropy=True)
    gen = portal.call(sampler.generate, prompt, params)
    assert len(gen) == len(gen.logprobs) == len(gen.versions) == len(gen.entropies) > 0
    assert sampler.model == SERVED  # discovered from /v1/models
    assert tok.decode(gen.token_ids) == gen.text
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + gen.token_ids])).logits[0, len(prompt) - 1 : -1]
    ref = torch.log_softmax(logits / 0.8, -1).gather(-1, torch.tensor(gen.token_ids)[:, None])
    gap = (torch.tensor(gen.logprobs) - ref[:, 0]).abs()
    print(f"\nopenai(vllm serve) vs HF: mean |gap| {gap.mean():.2e}, max {gap.max():.2e}")
    assert gap.mean() < 0.02


def test_bad_prompts_get_clear_errors(sampler, portal):
    with pytest.raises(PromptError, match="empty"):
        portal.call(sampler.generate, [], GREEDY)
    with pytest.raises(PromptError):
        portal.call(sampler.generate, [1] * 2000, GREEDY)


def test_unreachable_server_fails_after_retries(portal):
    port = _free_port()  # nothing listens there

    async def call():
        s = OpenAISampler("m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=2, backoff=0.01)
        try:
            await s.generate([1, 2, 3], GREEDY)
        finally:
            await s.close()

    with pytest.raises(SamplerError, match=r"after 3 attempts.*connection failed"):
        portal.call(call)


def test_update_weights_needs_the_reload_endpoint(server, portal, model_dir):
    async def call():
        s = OpenAISampler(base_url=server)
        try:
            await s.update_weights({}, 1)
        finally:
            await s.close()

    with pytest.raises(WeightUpdateError, match="cannot update weights"):
        portal.call(call)


def test_update_weights_through_the_reload_endpoint(sampler, portal, model_dir):
    original = load_file(str(model_dir / "model.safetensors"))
    perturbed = dict(original)
    g = torch.Generator().manual_seed(0)
    for k, v in original.items():
        if "mlp.down_proj" in k:
            perturbed[k] = v + torch.randn(v.shape, generator=g) * v.std() * 2
    prompt = sampler.tokenizer("Water boils at")["input_ids"]
    before = portal.call(sampler.generate, prompt, GREEDY)
    portal.call(sampler.update_weights, perturbed, 1)
    after = portal.call(sampler.generate, prompt, GREEDY)
    assert sampler.version == 1 and after.versions == [1] * len(after)
    assert after.token_ids != before.token_ids
    with pytest.raises(WeightUpdateError, match="missing"):
        portal.call(sampler.update_weights, {"model.norm.weight": torch.ones(576)}, 2)
    assert sampler.version == 1
    portal.call(sampler.update_weights, original, 2)
    restored = portal.call(sampler.generate, prompt, GREEDY)
    assert restored.token_ids == before.token_ids and restored.versions == [2] * len(restored)
