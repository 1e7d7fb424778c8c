"""On-policy distillation: a teacher's log-probs on the student's own sampled tokens.

The student samples, the teacher scores every sampled token, and the per-token reverse KL
estimate ``log pi_student(y_t) - log pi_teacher(y_t)`` (one sample of
``KL(pi_student || pi_teacher)`` at that position) is a cost: its negative is the token's
advantage (Agarwal et al. 2024, "On-Policy Distillation of Language Models", arXiv
2306.13649; Thinking Machines' "On-Policy Distillation", 2025). Mixed with the task
reward's advantage by a weight:

    A_t = reward_weight * A_task_t - weight * (log pi_student(y_t) - log pi_teacher(y_t))

Tensors are ``[B, T]`` aligned with the batch's ``input_ids`` (position ``t`` holds the
log-prob of token ``t``); only trained tokens (``mask`` 1) get a value.
"""

from __future__ import annotations

from torch import Tensor


def reverse_kl(student_logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor) -> Tensor:
    """The per-token reverse KL estimate ``log pi_s - log pi_t`` on the trained tokens
    ``[B, T]`` (0 elsewhere)."""
    return (student_logprobs.float() - teacher_logprobs.float()) * (mask > 0)


def distill_advantages(
    student_logprobs: Tensor,
    teacher_logprobs: Tensor,
    mask: Tensor,
    task_advantages: Tensor | None = None,
    *,
    weight: float = 1.0,
    reward_weight: float = 0.0,
) -> Tensor:
    """Per-token advantages ``[B, T]``: ``reward_weight * task_advantages - weight *
    reverse_kl``, 0 on untrained tokens. `task_advantages` (``[B, T]``, or None for
    distillation alone) are the estimator's from the task reward."""
    adv = -weight * reverse_kl(student_logprobs, teacher_logprobs, mask)
    if task_advantages is not None and reward_weight != 0:
        adv = adv + reward_weight * task_advantages.float() * (mask > 0)
    return adv
