"""Tiny-model fixtures: trajectory groups whose behaviour log-probs come from the model."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator

import pytest
import torch

from agentrl.config import Config, config_from_dict
from agentrl.models import tiny_llama
from agentrl.types import Segment, Trajectory, TrajectoryGroup

VOCAB = 49152


@torch.no_grad()
def hf_logprobs(model: torch.nn.Module, ids: list[int], temperature: float = 1.0) -> list[float]:
    """Plain HF forward: log p(ids[t] | ids[:t]) = log_softmax(logits[t-1] / T)[ids[t]]."""
    x = torch.tensor([ids])
    logits = model(input_ids=x).logits[0].float() / temperature
    lp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, x[0, 1:, None]).squeeze(-1)
    return [0.0, *lp.tolist()]


def make_traj(
    model: torch.nn.Module,
    rng: random.Random,
    *,
    reward: float,
    version: int = 0,
    turns: int = 2,
    temperature: float = 1.0,
    status: str = "ok",
    traj_id: str = "",
    task_id: str = "t",
) -> Trajectory:
    kinds: list[tuple[str, int]] = [("prompt", rng.randint(6, 12))]
    for i in range(turns):
        kinds.append(("model", rng.randint(4, 10)))
        if i < turns - 1:
            kinds.append(("observation", rng.randint(3, 6)))
    ids = [rng.randrange(3, VOCAB) for _, n in kinds for _ in range(n)]
    lps = hf_logprobs(model, ids, temperature)
    segments, pos = [], 0
    for kind, n in kinds:
        tok = ids[pos : pos + n]
        if kind == "model":
            segments.append(
                Segment("model", tok, logprobs=lps[pos : pos + n], versions=[version] * n)
            )
        else:
            segments.append(Segment(kind, tok))  # type: ignore[arg-type]
        pos += n
    return Trajectory(
        segments=segments,
        reward=reward,
        status=status,  # type: ignore[arg-type]
        task_id=task_id,
        group_id=task_id,
        traj_id=traj_id or f"{task_id}-{rng.randrange(10**9)}",
    )


def make_groups(
    model: torch.nn.Module,
    n_groups: int = 2,
    group_size: int = 4,
    seed: int = 0,
    version: int = 0,
    temperature: float = 1.0,
) -> list[TrajectoryGroup]:
    rng = random.Random(seed)
    groups = []
    for g in range(n_groups):
        rewards = [float(i % 2) for i in range(group_size)]
        rng.shuffle(rewards)
        trajs = [
            make_traj(
                model, rng, reward=r, version=version, temperature=temperature, task_id=f"task{g}"
            )
            for r in rewards
        ]
        groups.append(TrajectoryGroup(task_id=f"task{g}", trajectories=trajs, group_id=f"g{g}"))
    return groups


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Tiny models gain nothing from threads, and on a shared 2-core box OpenMP spinning
    makes them ~10x slower; the previous setting is restored for the rest of the suite."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="package", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def base_model() -> torch.nn.Module:
    with one_torch_thread():
        return tiny_llama(seed=0)


@pytest.fixture
def fresh_model(base_model: torch.nn.Module) -> Callable[[], torch.nn.Module]:
    """A factory of independent copies of the seeded tiny model (float32)."""
    state = {k: v.clone() for k, v in base_model.state_dict().items()}

    def make() -> torch.nn.Module:
        m = tiny_llama(seed=0)
        m.load_state_dict(state)
        return m

    return make


@pytest.fixture(scope="session")
def groups(base_model: torch.nn.Module) -> list[TrajectoryGroup]:
    with one_torch_thread():
        return make_groups(base_model, seed=1)


def make_cfg(**sections: dict) -> Config:
    data: dict = {
        "learner": {"lr": 1e-3, "micro_batch_size": 3, "bf16": "off", "device": "cpu"},
        "rollout": {"max_tokens": 64},
    }
    for k, v in sections.items():
        data.setdefault(k, {}).update(v)
    return config_from_dict(data)
