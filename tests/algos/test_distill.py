"""On-policy distillation's advantage: A = reward_weight * A_task - weight * (log p_s - log p_t)."""

from __future__ import annotations

import math

import torch

from agentrl.algos.distill import distill_advantages, reverse_kl


def test_the_advantage_is_the_negative_reverse_kl_on_trained_tokens() -> None:
    # row 0: p_s = 0.5, 0.25 vs p_t = 0.25, 0.5 on its two trained tokens; row 1: one token
    student = torch.log(torch.tensor([[1.0, 0.5, 0.25], [1.0, 0.8, 0.9]]))
    teacher = torch.log(torch.tensor([[1.0, 0.25, 0.5], [1.0, 0.2, 0.9]]))
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    adv = distill_advantages(student, teacher, mask)
    ln2, ln4 = math.log(2), math.log(4)
    expected = torch.tensor([[0.0, -ln2, ln2], [0.0, -ln4, 0.0]])
    torch.testing.assert_close(adv, expected)
    # the student's excess over the teacher is a cost; the teacher's favourites are paid
    torch.testing.assert_close(reverse_kl(student, teacher, mask), -expected)


def test_mixed_with_the_task_advantage_by_weights() -> None:
    student = torch.log(torch.tensor([[0.5, 0.5]]))
    teacher = torch.log(torch.tensor([[0.25, 1.0]]))
    mask = torch.tensor([[1.0, 1.0]])
    task = torch.tensor([[2.0, 2.0]])
    adv = distill_advantages(student, teacher, mask, task, weight=0.5, reward_weight=0.25)
    # 0.25 * 2 - 0.5 * (ln .5 - ln .25) = 0.5 - 0.5 ln 2 ; 0.5 - 0.5 * (ln .5 - 0) = 0.5 + 0.5 ln 2
    ln2 = math.log(2)
    torch.testing.assert_close(adv, torch.tensor([[0.5 - 0.5 * ln2, 0.5 + 0.5 * ln2]]))
    # reward_weight 0: distillation alone, the task advantage is ignored
    alone = distill_advantages(student, teacher, mask, task, weight=1.0, reward_weight=0.0)
    torch.testing.assert_close(alone, distill_advantages(student, teacher, mask))
