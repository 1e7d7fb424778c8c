"""The learner: logprob recomputation, losses, optimizer, weight publishing, checkpoints."""

from agentrl.learner.checkpoint import atomic_directory, resolve_checkpoint
from agentrl.learner.critic import ValueHead, ValueModel
from agentrl.learner.forward import token_logprobs
from agentrl.learner.learner import Learner

__all__ = [
    "Learner",
    "ValueHead",
    "ValueModel",
    "atomic_directory",
    "resolve_checkpoint",
    "token_logprobs",
]
