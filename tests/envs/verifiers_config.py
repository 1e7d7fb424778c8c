"""The training config both verifiers test files run an environment with (2 steps, tiny model)."""

from __future__ import annotations

from typing import Any

from agentrl.config import config_from_dict


def verifiers_config(env_id: str, **options: Any) -> Any:
    return config_from_dict(
        {
            "model": {"name": "tiny-llama", "dtype": "float32"},
            "sampler": {"max_new_tokens": 6, "max_batch_size": 16},
            "env": {"name": "verifiers", "options": {"id": env_id, **options}},
            "rollout": {"group_size": 2, "concurrency": 8, "max_tokens": 200, "infra_retries": 0},
            "algorithm": {"dynamic_sampling": False},
            "learner": {
                "batch_groups": 1,
                "micro_batch_size": 4,
                "lr": 1e-3,
                "fused_logprobs": "off",
            },
            "orchestrator": {
                "max_steps": 2,
                "max_staleness": 0,
                "learner_worker": "thread",
                "checkpoint_every": 0,
            },
            "logging": {"progress": False},
        }
    )
