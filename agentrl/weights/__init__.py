"""Weight transfer from the learner to the samplers, one idea per module.

- :mod:`~agentrl.weights.bus`: :class:`WeightBus` and the transports it delivers through.
- :mod:`~agentrl.weights.spec`: :class:`WeightSpec`, the check a sampler runs on new weights.
- :mod:`~agentrl.weights.files`: the shared-memory root and safetensors folders.
- :mod:`~agentrl.weights.shared`: flat shared-memory buffers (the learner process's weights).
"""

from __future__ import annotations

from agentrl.weights.bus import (
    PublishReport,
    SafetensorsDirTransport,
    StateDictTransport,
    WeightBus,
    WeightTransport,
    register_transport,
)
from agentrl.weights.spec import WeightSpec

__all__ = [
    "PublishReport",
    "SafetensorsDirTransport",
    "StateDictTransport",
    "WeightBus",
    "WeightSpec",
    "WeightTransport",
    "register_transport",
]
