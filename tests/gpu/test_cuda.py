"""On CUDA: a 3-step training run (the learner in a thread and in its own process, weights
over CUDA IPC), behaviour-vs-learner log-prob agreement, a weight update while generating.

Tiny model (correctness, not speed: benchmarks/gpu.py measures speed)."""

from __future__ import annotations

import random

import anyio
import pytest
import torch

from agentrl.config import config_from_dict, load_config
from agentrl.learner import Learner
from agentrl.models import load_model, tiny_llama
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.placement.learner_process import LearnerProcess
from agentrl.run.settings import resolve
from agentrl.samplers import SamplingParams
from agentrl.samplers.hf import HFSampler
from agentrl.types import Segment, Trajectory, TrajectoryGroup
from agentrl.weights import WeightBus
from tests.orchestrator.test_train import BASE
from tests.waiting import wait_until_async

CUDA = ["sampler.device=cuda", "learner.device=cuda"]


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_three_training_steps_on_cuda(tmp_path, worker):
    from safetensors.torch import load_file

    from agentrl.run.events import WeightsPublished
    from agentrl.runfolder import latest_checkpoint

    cfg = load_config(
        overrides=[
            *BASE,
            *CUDA,
            "orchestrator.max_steps=3",
            f"orchestrator.learner_worker={worker}",
            "orchestrator.max_staleness=1",
        ]
    )
    orch = Orchestrator(cfg, tmp_path / "run")
    orch.build()
    before = {k: v.clone() for k, v in orch.sampler.model.state_dict().items()}
    published: set[str] = set()  # where the weights the bus delivered live

    def on_event(event):
        if isinstance(event, WeightsPublished):
            published.update(t.device.type for t in orch.learner.state_dict_for_sampler().values())

    orch.events.subscribe(on_event)
    anyio.run(orch.run)
    assert orch.step == 3 and orch.sampler.version == 3
    assert next(orch.sampler.model.parameters()).device.type == "cuda"
    # in-process: the learner's own device tensors; learner process: its buffers by IPC handle
    assert published == {"cuda"}
    after = orch.sampler.model.state_dict()
    assert any(not before[k].equal(after[k]) for k in before)  # the sampler got new weights
    ckpt = latest_checkpoint(orch.run_dir)  # the last step always checkpoints
    for name, t in load_file(str(ckpt / "learner" / "model.safetensors")).items():
        torch.testing.assert_close(after[name].float().cpu(), t)  # = the last publish


def test_behaviour_and_learner_logprobs_agree_on_cuda():
    model, tokenizer = load_model("tiny-llama", dtype="float32", device="cuda")
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=())
    prompt = tokenizer("what is 2+2?")["input_ids"]

    async def sample():
        try:
            return [
                await sampler.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=24))
                for _ in range(4)
            ]
        finally:
            await sampler.close()

    gens = anyio.run(sample)
    trajs = [
        Trajectory(
            segments=[
                Segment("prompt", list(prompt)),
                Segment("model", g.token_ids, logprobs=g.logprobs, versions=g.versions),
            ],
            reward=float(i % 2),
            traj_id=str(i),
        )
        for i, g in enumerate(gens)
    ]
    group = TrajectoryGroup(task_id="t", trajectories=trajs)
    cfg = config_from_dict({"learner": {"device": "cuda", "bf16": "off"}})
    learner = Learner(tiny_llama(0), tokenizer, resolve(cfg).learner)
    learner_lp = learner.compute_logprobs([group]).cpu()
    from agentrl.types import Batch

    batch = Batch.from_groups([group], pad_token_id=learner.pad_token_id)
    mask = batch.loss_mask.bool()
    gap = (learner_lp[mask] - batch.behavior_logprobs[mask]).abs().max().item()
    assert gap < 1e-3, f"sampler vs learner log-prob gap {gap:.2e} on CUDA in float32"


def test_a_weight_update_while_generating_on_cuda():
    model, tokenizer = load_model("tiny-llama", dtype="float32", device="cuda")
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=())
    learner_model = tiny_llama(0).cuda()
    with torch.no_grad():
        for p in learner_model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    new = {k: v.detach() for k, v in learner_model.state_dict().items()}
    bus = WeightBus()
    bus.register(sampler)
    prompt = tokenizer("hello")["input_ids"]
    result = {}

    async def main():
        async def run(i):
            result[i] = await sampler.generate(
                prompt, SamplingParams(temperature=1.0, max_new_tokens=300)
            )

        try:
            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(run, i)
                # mid-generation (300 tokens each, no stop token): the update lands between tokens
                await wait_until_async(
                    lambda: sampler.stats()["tokens"] >= 20, "20 tokens generated"
                )
                await bus.publish(1, new)
        finally:
            await sampler.close()

    anyio.run(main)
    for gen in result.values():
        assert gen.versions[0] == 0 and gen.versions[-1] == 1
        assert gen.versions == sorted(gen.versions)
    for name, t in sampler.model.state_dict().items():
        torch.testing.assert_close(t, new[name].to(t.dtype))


def test_a_learner_process_on_cuda_shares_by_ipc_and_via_host(tmp_path):
    rng = random.Random(0)
    for sharing in ("cuda_ipc", "shared_memory"):
        cfg = config_from_dict(
            {
                "model": {"name": "tiny-llama"},
                "learner": {"device": "cuda", "weight_sharing": sharing},
            }
        )
        learner = LearnerProcess(cfg)
        try:
            weights = learner.state_dict_for_sampler()
            want = "cuda" if sharing == "cuda_ipc" else "cpu"
            assert {t.device.type for t in weights.values()} == {want}
            fresh = tiny_llama(0).state_dict()
            name = rng.choice(sorted(fresh))
            torch.testing.assert_close(weights[name].cpu(), fresh[name])
        finally:
            learner.close()


def test_a_swap_from_cuda_weights_copies_device_to_device_only():
    """The hf sampler's update path never takes the weights through host memory when the
    learner's tensors and the sampler are both on the GPU (CUDA memcpy kinds, profiled)."""
    from torch.profiler import ProfilerActivity, profile

    model, tokenizer = load_model("tiny-llama", dtype="bfloat16", device="cuda")
    sampler = HFSampler(model, tokenizer, default_stop_token_ids=())
    new = {k: v.float().add(0.01) for k, v in model.state_dict().items()}  # fp32, as a learner
    torch.cuda.synchronize()

    async def swap():
        try:
            await sampler.update_weights(new, 1)
        finally:
            await sampler.close()

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        anyio.run(swap)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert names, "the profiler saw no CUDA activity: nothing to judge"
    assert not [n for n in names if "HtoD" in n or "DtoH" in n], sorted(set(names))[:10]
    for name, t in sampler.model.state_dict().items():
        torch.testing.assert_close(t, new[name].to(t.dtype))


def test_host_synchronisations_do_not_grow_with_micro_batches():
    """The micro-batch loop leaves its metrics and log-probs on the device (issue 38): a step
    of 8 micro-batches makes as many host synchronisations of agentrl's own as one of 2.

    Each synchronisation torch reports (``set_sync_debug_mode("warn")``) is attributed by
    the Python stack it was raised from: inside transformers' forward or autograd's backward
    it is the model's (transformers' packed-sequence check reads the device once a
    forward), else agentrl's."""
    import traceback
    import warnings
    from collections import Counter

    from agentrl.models import load_tokenizer

    def groups(n):
        return [
            TrajectoryGroup(
                task_id=str(g),
                group_id=str(g),
                trajectories=[
                    Trajectory(
                        segments=[
                            Segment("prompt", [5 + g, 6, 7]),
                            Segment("model", [8, 9, 10], logprobs=[-1.0] * 3, versions=[0] * 3),
                        ],
                        reward=float(i % 2),
                        traj_id=f"{g}-{i}",
                    )
                    for i in range(2)
                ],
            )
            for g in range(n)
        ]

    def syncs(micro_batch_size):
        cfg = config_from_dict(
            {
                "learner": {
                    "device": "cuda",
                    "micro_batch_size": micro_batch_size,
                    "share_prompt": False,
                }
            }
        )
        learner = Learner(tiny_llama(0), load_tokenizer("tiny-llama"), resolve(cfg).learner)
        learner.step(groups(4))  # warm-up
        torch.cuda.synchronize()
        counts: Counter[str] = Counter()
        where: Counter[str] = Counter()

        def record(message, category, filename, lineno, file=None, line=None):
            if "synchroniz" not in str(message):
                return
            stack = traceback.extract_stack()[:-1]
            model = any(
                "/transformers/" in f.filename or "/torch/autograd/" in f.filename for f in stack
            )
            counts["model" if model else "agentrl"] += 1
            if not model:
                own = [f for f in stack if "/agentrl/" in f.filename]
                where[
                    f"{own[-1].filename.split('/agentrl/')[-1]}:{own[-1].lineno}" if own else "?"
                ] += 1

        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = record
                learner.step(groups(4))
        finally:
            torch.cuda.set_sync_debug_mode(0)
        return counts, where

    (many, where_many), (few, _) = syncs(1), syncs(4)
    assert few["agentrl"] > 0, "the debug mode reported nothing: the check would be vacuous"
    assert many["agentrl"] <= few["agentrl"], (
        f"agentrl's host synchronisations grew with the number of micro-batches: "
        f"{many['agentrl']} at 8 micro-batches vs {few['agentrl']} at 2; at 8: {dict(where_many)}"
    )
