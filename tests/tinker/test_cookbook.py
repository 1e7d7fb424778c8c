"""tinker-cookbook's own supervised and RL training loops, unchanged, against the local
Tinker server on the tiny model (``make test-integration``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "tinker_cookbook", reason="needs tinker-cookbook (pip install 'agentrl[tinker]')"
)

import chz
import tinker
from safetensors.torch import load_file

pytestmark = pytest.mark.integration

CONVERSATION = {
    "messages": [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
    ]
}


def _metrics(log_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def _final_adapter(server: Any, log_path: Path) -> dict[str, Any]:
    record = json.loads((log_path / "checkpoints.jsonl").read_text().splitlines()[-1])
    folder, _ = server.service.engine._folder(record["sampler_path"])
    return load_file(str(folder / "adapter.safetensors"))


def test_the_cookbook_supervised_loop_lowers_the_nll(server, tiny_folder, tmp_path, monkeypatch):
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    monkeypatch.setenv("TINKER_API_KEY", "tml-local-test")
    data = tmp_path / "conversations.jsonl"
    data.write_text("\n".join(json.dumps(CONVERSATION) for _ in range(8)) + "\n")
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=str(tiny_folder),
        renderer_name="role_colon",
        max_length=128,
        batch_size=4,
        train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES,
    )
    log_path = tmp_path / "sft"
    config = train.Config(
        log_path=str(log_path),
        model_name=str(tiny_folder),
        recipe_name="agentrl_tinker_test",
        renderer_name="role_colon",
        dataset_builder=FromConversationFileBuilder(common_config=common, file_path=str(data)),
        learning_rate=1e-2,
        num_epochs=3,
        lora_rank=8,
        base_url=server.url,
        save_every=0,
        eval_every=0,
        infrequent_eval_every=0,
    )
    asyncio.run(train.main(config))
    nll = [m["train_mean_nll"] for m in _metrics(log_path) if "train_mean_nll" in m]
    assert len(nll) == 6
    assert nll[-1] < 0.8 * nll[0], nll
    adapter = _final_adapter(server, log_path)
    assert any(t.abs().sum() > 0 for k, t in adapter.items() if "lora_B" in k)


HALF = 49152 // 2


def test_the_cookbook_rl_loop_runs_and_trains(server, tiny_folder, tmp_path, monkeypatch):
    from tinker_cookbook.rl import train
    from tinker_cookbook.rl.types import (
        Env,
        EnvGroupBuilder,
        RLDataset,
        RLDatasetBuilder,
        StepResult,
    )

    class LowIds(Env):
        """Reward: the share of sampled token ids in the lower half of the vocabulary."""

        async def initial_observation(self) -> Any:
            return tinker.ModelInput.from_ints([1, 520, 1134, 28]), []

        async def step(self, action: Any, *, extra: Any = None) -> StepResult:
            reward = sum(t < HALF for t in action) / len(action)
            return StepResult(
                reward=reward,
                episode_done=True,
                next_observation=tinker.ModelInput.empty(),
                next_stop_condition=[],
                metrics={"low": reward},
            )

    class Group(EnvGroupBuilder):
        async def make_envs(self) -> list[Env]:
            return [LowIds() for _ in range(4)]

        def logging_tags(self) -> list[str]:
            return ["low_ids"]

    class Batches(RLDataset):
        def get_batch(self, index: int) -> list[EnvGroupBuilder]:
            return [Group() for _ in range(3)]

        def __len__(self) -> int:
            return 3

    @chz.chz
    class Builder(RLDatasetBuilder):
        async def __call__(self) -> tuple[RLDataset, None]:
            return Batches(), None

    monkeypatch.setenv("TINKER_API_KEY", "tml-local-test")
    log_path = tmp_path / "rl"
    config = train.Config(
        learning_rate=1e-2,
        dataset_builder=Builder(),
        model_name=str(tiny_folder),
        recipe_name="agentrl_tinker_test",
        max_tokens=4,
        log_path=str(log_path),
        eval_every=0,
        save_every=0,
        lora_rank=8,
        base_url=server.url,
        num_groups_to_log=0,
        rollout_json_export=False,
    )
    asyncio.run(train.main(config))
    steps = [m for m in _metrics(log_path) if "env/all/reward/total" in m]
    assert len(steps) == 3
    assert all(0.0 <= m["env/all/reward/total"] <= 1.0 for m in steps)
    adapter = _final_adapter(server, log_path)
    assert any(t.abs().sum() > 0 for k, t in adapter.items() if "lora_B" in k)
