"""The learner: logprob recomputation, losses, optimizer, weight publishing, checkpoints.

:class:`Learner` trains in this process; :class:`~agentrl.run.placement.learner_process.LearnerProcess`
runs one in a child process; both are :class:`LearnerLike`.
"""

from agentrl.learner.critic import ValueHead, ValueModel
from agentrl.learner.forward import token_logprobs
from agentrl.learner.learner import Learner
from agentrl.learner.objective import Objective
from agentrl.learner.protocol import LearnerLike

__all__ = [
    "Learner",
    "LearnerLike",
    "Objective",
    "ValueHead",
    "ValueModel",
    "token_logprobs",
]
