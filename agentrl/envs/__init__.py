"""Environments (installed as agentrl.envs).

    from agentrl.envs import make_env
    env = make_env("code_math", generators=["chain_sum"])
    task = next(env.tasks(seed=0))

Built-ins: ``code_math`` (reasoning-gym arithmetic or a user's {question, answer} file,
python tool) and ``search_qa`` (questions about countries, local search tool). Plug-ins:
the ``agentrl.envs`` entry-point group or a ``module:Class`` path; see agentrl/envs/README.md.
"""

from agentrl.envs.base import (
    AssistantTurn,
    EnvBase,
    Environment,
    EnvOptions,
    Message,
    StepResult,
    ToolEnvironment,
    safe_reset,
    safe_step,
)
from agentrl.envs.program import AgentProgram, AnyEnvironment, ModelEndpoint
from agentrl.envs.registry import ENTRY_POINT_GROUP, EnvInfo, list_envs, make_env, resolve
from agentrl.envs.verifiers import (
    ExactMatchVerifier,
    MathVerifier,
    ReasoningGymVerifier,
    Verifier,
    extract_answer,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "AgentProgram",
    "AnyEnvironment",
    "AssistantTurn",
    "EnvBase",
    "EnvInfo",
    "EnvOptions",
    "Environment",
    "ExactMatchVerifier",
    "MathVerifier",
    "Message",
    "ModelEndpoint",
    "ReasoningGymVerifier",
    "StepResult",
    "ToolEnvironment",
    "Verifier",
    "extract_answer",
    "list_envs",
    "make_env",
    "resolve",
    "safe_reset",
    "safe_step",
]
