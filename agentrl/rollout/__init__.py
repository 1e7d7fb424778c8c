"""Episode runner, actors and ARPO branching.

from agentrl.rollout import RolloutEngine, run_episode, JsonlSink
"""

from agentrl.chat import Renderer
from agentrl.rollout.engine import GroupSink, RolloutEngine, sampling_params_from
from agentrl.rollout.episode import EpisodeLimits, run_episode
from agentrl.rollout.group import decide_branch, run_branching_group, run_group
from agentrl.rollout.sinks import JsonlSink
from agentrl.rollout.tree import check_shared_prefixes

__all__ = [
    "EpisodeLimits",
    "GroupSink",
    "JsonlSink",
    "Renderer",
    "RolloutEngine",
    "check_shared_prefixes",
    "decide_branch",
    "run_branching_group",
    "run_episode",
    "run_group",
    "sampling_params_from",
]
