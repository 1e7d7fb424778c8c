"""Shared by the training runs through vLLM (test_vllm_train.py, test_openai_train.py): a tiny
model folder vLLM can serve, the `agentrl` CLI, and the token-exactness audit of a run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]


def save_tiny_model(folder: Path) -> Path:
    """A seeded 2-layer Llama with SmolLM2's tokenizer, saved as a Hugging Face folder.

    ``tiny-llama`` itself has head_dim 16, which vLLM's CPU attention does not support
    ("Unsupported CPU attention configuration: head_dim=16"); this one has head_dim 32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentrl.models import load_tokenizer

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).float().eval()
    model.save_pretrained(folder)
    load_tokenizer("tiny-llama").save_pretrained(folder)
    return folder


def agentrl(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``agentrl ARGS`` in this interpreter's environment; fails the test with its stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"agentrl {args[0]} failed:\n{done.stderr[-4000:]}"
    return done


def sets(*overrides: str) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def policy_weights(run_dir: Path, base: Path) -> dict[int, Path]:
    """Weights by version that the run still has: the base folder (0) and its checkpoints."""
    from agentrl.runfolder import policy_weights_file

    found = {0: base / "model.safetensors"}
    for ckpt in sorted((run_dir / "checkpoints").glob("step_*")):
        weights, version = policy_weights_file(ckpt)
        found[version] = weights
    return found


def audit_tokens(run_dir: Path, base: Path, temperature: float) -> dict[int, int | None]:
    """Recompute, with the weights of each token's version, the log-prob of every sampled
    token in ``trajectories.jsonl`` and compare with the behaviour log-prob the run trained
    on. Returns {version: tokens checked} for every version the tokens carry (None for a
    version whose weights the run no longer keeps)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    weights = policy_weights(run_dir, base)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
    checked: dict[int, int | None] = {}
    loaded = None
    groups = read_jsonl(run_dir / "trajectories.jsonl")
    trajectories = [t for g in groups for t in g["trajectories"]]
    assert trajectories
    versions = {v for t in trajectories for s in t["segments"] for v in s.get("versions") or []}
    for version in sorted(versions):
        if version not in weights:
            checked[version] = None
            continue
        if loaded != version:
            state = load_file(str(weights[version]))
            model.load_state_dict(state, strict=False)  # a tied lm_head may be absent
            loaded = version
        for traj in trajectories:
            ids: list[int] = []
            for seg in traj["segments"]:
                start = len(ids)
                ids += seg["token_ids"]
                if seg["kind"] != "model" or version not in seg["versions"]:
                    continue
                with torch.no_grad():
                    logits = model(torch.tensor([ids])).logits[0, start - 1 : -1].float()
                logp = torch.log_softmax(logits / temperature, -1)
                recomputed = logp.gather(1, torch.tensor(seg["token_ids"])[:, None])[:, 0]
                mine = torch.tensor([v == version for v in seg["versions"]])
                behaviour = torch.tensor(seg["logprobs"])
                gap = (recomputed - behaviour)[mine].abs().max()
                assert gap < 2e-3, f"version {version}: behaviour log-prob off by {gap:.2e}"
                checked[version] = (checked.get(version) or 0) + int(mine.sum())
    return checked


@contextlib.contextmanager
def vllm_server(model_dir: Path, log: Path, *args: str) -> Iterator[str]:
    """`vllm serve MODEL_DIR` on 127.0.0.1 with the reload endpoints and our log-prob
    definition (as tests/samplers/test_openai_sampler.py starts it); yields its URL."""
    import httpx

    from agentrl.samplers.vllm_cpu import configure_cpu_env
    from agentrl.samplers.vllm_worker import WORKER_EXTENSION

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    configure_cpu_env()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    # (the `vllm` console script looks up the `vllm` distribution, which vllm-cpu is not)
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
        "--logprobs-mode", "processed_logprobs", "--worker-extension-cls", WORKER_EXTENSION,
        *args,
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
