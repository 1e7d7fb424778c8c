"""agentrl: asynchronous reinforcement learning for tool-using LLM agents."""

from agentrl.config import Config, load_config
from agentrl.errors import AgentRLError, ConfigError
from agentrl.types import Batch, Segment, Trajectory, TrajectoryGroup

__version__ = "0.1.0"

__all__ = [
    "AgentRLError",
    "Batch",
    "Config",
    "ConfigError",
    "Segment",
    "Trajectory",
    "TrajectoryGroup",
    "__version__",
    "load_config",
]
