"""Pure tensor algorithms for RL on LLMs, each registered by name.

    from agentrl.algos import compute_advantages, policy_loss
    adv = compute_advantages("grpo", rewards, group_ids, valid=valid)          # [B]
    adv, returns = estimate_advantages("gae", rewards, group_ids, values=values,
                                       mask=loss_mask, gamma=1.0, lam=0.95)   # [B, T]
    loss, metrics = policy_loss("ppo", logprobs, old_logprobs, adv, loss_mask,
                                eps_low=0.2, eps_high=0.28, agg="token-mean")

Add your own with ``@register_advantage``, ``@register_policy_loss``, ``@register_kl``,
``@register_aggregation``, ``@register_tree_attribution`` or ``@register_off_policy_mask``; configs then name them.
"""

from agentrl.algos.advantages import (
    compute_advantages,
    compute_gae,
    dynamic_sampling_mask,
    estimate_advantages,
    group_stats,
    place_outcome_rewards,
)
from agentrl.algos.aggregation import aggregate
from agentrl.algos.evaluation import maj_at_k, pass_at_k
from agentrl.algos.family import gmpo_loss as gmpo_loss  # registers the family's methods
from agentrl.algos.gigpo import gigpo as gigpo  # registers "gigpo"
from agentrl.algos.grpo_lambda import grpo_lambda as grpo_lambda  # registers "grpo_lambda"
from agentrl.algos.kl import kl_divergence
from agentrl.algos.logprobs import (
    chunked_logprobs_entropy,
    entropy_from_logits,
    logprobs_from_logits,
    sequence_logprobs_entropy,
)
from agentrl.algos.offpolicy import (
    correction_weights,
    importance_weights,
    loglinear_proximal_logprobs,
    rejection_mask,
)
from agentrl.algos.policy import (
    entropy_bonus,
    policy_loss,
    value_loss,
)
from agentrl.algos.raft import raft as raft  # registers RAFT and the reinforce loss
from agentrl.algos.registry import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    OFF_POLICY_MASKS,
    POLICY_LOSSES,
    TREE_ATTRIBUTIONS,
    AdvantageInputs,
    AdvantageRegistry,
    LossInputs,
    Registry,
    keyword_parameters,
    register_advantage,
    register_aggregation,
    register_kl,
    register_off_policy_mask,
    register_policy_loss,
    register_tree_attribution,
)
from agentrl.algos.shaping import kl_penalized_rewards, overlong_filter, overlong_penalty
from agentrl.algos.stale import cispo_loss as cispo_loss  # registers the stale-data losses
from agentrl.algos.tree import TreeAttribution, tree_advantages, tree_from_ids, tree_owner
from agentrl.algos.tree_grpo import tree_grpo as tree_grpo  # registers "tree_grpo"

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "OFF_POLICY_MASKS",
    "POLICY_LOSSES",
    "TREE_ATTRIBUTIONS",
    "AdvantageInputs",
    "AdvantageRegistry",
    "LossInputs",
    "Registry",
    "TreeAttribution",
    "aggregate",
    "chunked_logprobs_entropy",
    "compute_advantages",
    "compute_gae",
    "correction_weights",
    "dynamic_sampling_mask",
    "entropy_bonus",
    "entropy_from_logits",
    "estimate_advantages",
    "group_stats",
    "importance_weights",
    "keyword_parameters",
    "kl_divergence",
    "kl_penalized_rewards",
    "loglinear_proximal_logprobs",
    "logprobs_from_logits",
    "maj_at_k",
    "overlong_filter",
    "overlong_penalty",
    "pass_at_k",
    "place_outcome_rewards",
    "policy_loss",
    "register_advantage",
    "register_aggregation",
    "register_kl",
    "register_off_policy_mask",
    "register_policy_loss",
    "register_tree_attribution",
    "rejection_mask",
    "sequence_logprobs_entropy",
    "tree_advantages",
    "tree_from_ids",
    "tree_owner",
    "value_loss",
]
