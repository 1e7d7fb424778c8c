"""Name -> function registries, so configs pick algorithms by string and users add their own.

    @register_advantage("my_adv")
    def my_adv(rewards, group_ids, *, valid=None, my_option=1.0): ...

    @register_advantage("my_gae", needs_critic=True)
    def my_gae(rewards, group_ids, *, valid=None, values, mask, gamma, lam):
        return advantages, returns  # both [B, T]

Every estimator is called ``fn(rewards [B], group_ids [B], valid=[B], **options)`` and
returns advantages, ``[B]`` per sequence or ``[B, T]`` per token. One registered with
``needs_critic=True`` also gets the critic's ``values`` and the ``mask`` ``[B, T]``,
``gamma`` and ``lam``, and returns ``(advantages [B, T], returns [B, T])`` -- the returns
are the value loss's targets. Options (``algorithm.options`` in a config) reach a function
through the keyword parameters it names (or its ``**kwargs``): see :func:`keyword_parameters`.

Inputs are typed: an estimator declares the fields of :class:`AdvantageInputs` it reads
(``@register_advantage(name, inputs=("turn_rewards", "turn_mask"))``), a policy loss those
of :class:`LossInputs`; the learner builds exactly the declared ones and passes each as the
keyword of its name. A new input is one field here. Without ``inputs=``, the declaration
is the function's keyword parameters that are fields (read once, at registration).

Unknown names raise :class:`agentrl.errors.UnknownNameError` with close-name suggestions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from agentrl.registry import Registry

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator may read beyond ``rewards``, ``group_ids`` and ``valid``
    (B rows, T tokens, K = most assistant turns of a row)."""

    mask: Any = field(metadata={"doc": "the loss mask [B, T] (1 on trained tokens)"})
    gamma: float = field(metadata={"doc": "algorithm.gamma"})
    tree_ids: Any = field(metadata={"doc": "each row's branch tree (its root row) [B]"})
    turn_index: Any = field(
        metadata={"doc": "the assistant turn of each trained token [B, T] (-1 elsewhere)"}
    )
    turn_ends: Any = field(
        metadata={"doc": "the last token of each turn [B, K] (-1 past a row's turns)"}
    )
    turn_rewards: Any = field(
        metadata={
            "doc": "step and process rewards per turn times reward.step_weight [B, K] (never the "
            "outcome; an estimator reading them gets the outcome alone as its rewards)"
        }
    )
    turn_mask: Any = field(metadata={"doc": "1.0 on a row's real turns [B, K]"})
    turn_states: Any = field(
        metadata={"doc": "per row, the state key each turn acted from (list of lists)"}
    )
    response_lengths: Any = field(metadata={"doc": "tokens after the prompt [B]"})


@dataclass(frozen=True)
class LossInputs:
    """What a policy loss may read beyond its log-probs, advantages and mask (each sliced to
    the micro-batch's rows)."""

    ref_logprobs: Any = field(
        metadata={"doc": "the reference policy's log-probs [B, T] (loads a reference model)"}
    )
    group_ids: Any = field(metadata={"doc": "each row's group [B]"})
    rewards: Any = field(
        metadata={"doc": "each row's return [B] (outcome plus weighted step rewards)"}
    )
    lengths: Any = field(metadata={"doc": "trained tokens per row [B]"})


def input_docs(kind: type) -> dict[str, str]:
    """Field name -> what it holds, of :class:`AdvantageInputs` or :class:`LossInputs`."""
    return {f.name: f.metadata["doc"] for f in fields(kind)}


def declared_inputs(
    fn: Callable[..., Any], inputs: Sequence[str] | None, kind: type, label: str
) -> tuple[str, ...]:
    """The fields of `kind` that `fn` reads: `inputs` checked against them, or (None) the
    keyword parameters of `fn` that are fields."""
    known = [f.name for f in fields(kind)]
    if inputs is None:
        named = keyword_parameters(fn)[0]
        return tuple(k for k in known if k in named)
    unknown = [k for k in inputs if k not in known]
    if unknown:
        raise ValueError(
            f"{label}: inputs {unknown} are not fields of {kind.__name__}; declare some of: "
            + ", ".join(known)
        )
    return tuple(inputs)


class AdvantageRegistry(Registry[Callable[..., Any]]):
    """Advantage estimators, each marked with whether it needs a learned value function."""

    def __init__(self) -> None:
        super().__init__("advantage")
        self._needs_critic: dict[str, bool] = {}
        self._token_rewards: dict[str, bool] = {}
        self._inputs: dict[str, tuple[str, ...]] = {}
        self._selects_rows: dict[str, bool] = {}

    def register(
        self,
        name: str,
        *,
        override: bool = False,
        needs_critic: bool = False,
        token_rewards: bool = False,
        inputs: Sequence[str] | None = None,
        selects_rows: bool = False,
    ) -> Callable[[F], F]:
        """Register ``fn(rewards [B], group_ids [B], *, valid=None, **options) -> advantages``.

        ``needs_critic=True``: ``fn`` also takes ``values=``, ``mask=`` ``[B, T]``, ``gamma=``
        and ``lam=`` and returns ``(advantages [B, T], returns [B, T])``.
        ``token_rewards=True`` (implied by ``needs_critic``): ``fn`` also accepts per-token
        rewards ``[B, T]`` with ``mask=`` and ``gamma=`` (``algorithm.kl_in_reward`` needs it).
        ``inputs``: the :class:`AdvantageInputs` fields ``fn`` reads, each passed as a keyword
        (None: its keyword parameters that are fields). ``selects_rows=True``: rows ``fn``
        gives advantage 0 leave the loss mask (RAFT's rejection sampling), so the loss is
        averaged over the kept rows only.
        """
        add = super().register(name, override=override)

        def deco(fn: F) -> F:
            declared = declared_inputs(fn, inputs, AdvantageInputs, f"advantage '{name}'")
            add(fn)
            self._needs_critic[name] = needs_critic
            self._token_rewards[name] = token_rewards or needs_critic
            self._inputs[name] = declared
            self._selects_rows[name] = selects_rows
            return fn

        return deco

    def selects_rows(self, name: str) -> bool:
        """Whether rows given advantage 0 by `name` leave the loss (rejection sampling):
        the loss then averages over the kept rows' tokens only."""
        self.get(name)
        return self._selects_rows.get(name, False)

    def inputs(self, name: str) -> tuple[str, ...]:
        """The :class:`AdvantageInputs` fields the estimator `name` reads."""
        fn = self.get(name)
        if name not in self._inputs:  # put in the table without register(): its parameters
            self._inputs[name] = declared_inputs(fn, None, AdvantageInputs, name)
        return self._inputs[name]

    def takes_token_rewards(self, name: str) -> bool:
        """Whether `name` also takes per-token rewards ``[B, T]`` (with ``mask=`` and
        ``gamma=``), as a KL penalty folded into the reward needs."""
        self.get(name)
        return self._token_rewards.get(name, False)

    def needs_critic(self, name: str) -> bool:
        """Whether the estimator `name` takes a critic's values (and returns value targets)."""
        self.get(name)  # unknown names raise with suggestions
        return self._needs_critic.get(name, False)


class PolicyLossRegistry(Registry[Callable[..., Any]]):
    """Policy losses, each marked with whether it couples the rows of a group (then
    minibatches and micro-batches keep every group whole)."""

    def __init__(self) -> None:
        super().__init__("policy_loss")
        self._couples_group: dict[str, bool] = {}
        self._inputs: dict[str, tuple[str, ...]] = {}

    def register(
        self,
        name: str,
        *,
        override: bool = False,
        couples_group: bool = False,
        inputs: Sequence[str] | None = None,
    ) -> Callable[[F], F]:
        """Register ``fn(logprobs, old_logprobs, advantages [B,T], mask, **kw) -> (loss [B,T], metrics)``.

        ``kw``: the clip settings it names (``eps_low``, ``eps_high``, ``dual_clip_c``), the
        options it names, and the batch inputs it names (the learner passes each one a loss
        names: ``ref_logprobs`` ``[B,T]``, ``group_ids`` ``[B]``, ``rewards`` ``[B]``,
        ``lengths`` ``[B]``). ``couples_group=True``: the loss mixes the rows of a group, so
        the learner never splits a group across minibatches or micro-batches. The returned
        per-token loss is then importance-weighted (off-policy correction) and aggregated by
        :func:`agentrl.algos.policy_loss`. ``inputs``: the :class:`LossInputs` fields it reads
        (None: its keyword parameters that are fields).
        """
        add = super().register(name, override=override)

        def deco(fn: F) -> F:
            declared = declared_inputs(fn, inputs, LossInputs, f"policy loss '{name}'")
            add(fn)
            self._couples_group[name] = couples_group
            self._inputs[name] = declared
            return fn

        return deco

    def inputs(self, name: str) -> tuple[str, ...]:
        """The :class:`LossInputs` fields the policy loss `name` reads."""
        fn = self.get(name)
        if name not in self._inputs:
            self._inputs[name] = declared_inputs(fn, None, LossInputs, name)
        return self._inputs[name]

    def couples_group(self, name: str) -> bool:
        self.get(name)
        return self._couples_group.get(name, False)


class AggregationRegistry(Registry[Callable[..., Any]]):
    """Aggregations, each marked with what it averages over (``token`` or ``sequence``):
    the learner divides micro-batch losses by the minibatch's count of that unit."""

    def __init__(self) -> None:
        super().__init__("aggregation")
        self._unit: dict[str, str] = {}

    def register(
        self, name: str, *, override: bool = False, unit: str = "sequence"
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        if unit not in ("token", "sequence"):
            raise ValueError(f"aggregation unit must be 'token' or 'sequence' (got {unit!r})")
        add = super().register(name, override=override)

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            add(fn)
            self._unit[name] = unit
            return fn

        return deco

    def unit(self, name: str) -> str:
        self.get(name)
        return self._unit.get(name, "sequence")


ADVANTAGES = AdvantageRegistry()
POLICY_LOSSES = PolicyLossRegistry()
KL_ESTIMATORS: Registry[Callable[..., Any]] = Registry("kl")
AGGREGATIONS = AggregationRegistry()
TREE_ATTRIBUTIONS: Registry[Callable[..., Any]] = Registry("tree_attribution")
OFF_POLICY_MASKS: Registry[Callable[..., Any]] = Registry("off_policy_mask")


# the registries' own register, typed: ``@register_advantage("name", needs_critic=True)``
register_advantage = ADVANTAGES.register
register_policy_loss = POLICY_LOSSES.register  # ``@register_policy_loss("name", ...)``


def register_kl(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Register ``fn(logprobs [B,T], ref_logprobs [B,T]) -> kl [B,T]``."""
    return KL_ESTIMATORS.register(name, override=override)


def register_aggregation(
    name: str, *, override: bool = False, unit: str = "sequence"
) -> Callable[[F], F]:
    """Register ``fn(loss [B,T], mask [B,T], *, norm_length=None, denominator=None) -> scalar``.

    ``unit``: what ``denominator`` counts when the learner splits a minibatch into
    micro-batches (``"token"``: trained tokens, ``"sequence"``: rows with tokens)."""
    return AGGREGATIONS.register(name, override=override, unit=unit)  # type: ignore[return-value]


def register_tree_attribution(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Register ``fn(advantages [B], owner [B,T], loss_mask [B,T]) -> (adv [B,T], mask [B,T])``."""
    return TREE_ATTRIBUTIONS.register(name, override=override)


def register_off_policy_mask(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Register ``fn(log_ratio [B,T], mask [B,T], *, low, high) -> keep [B,T]`` (1 keeps a
    token in the loss, 0 drops it); ``log_ratio`` is log(pi_old / pi_behave), detached."""
    return OFF_POLICY_MASKS.register(name, override=override)


def keyword_parameters(fn: Callable[..., Any]) -> tuple[list[str], bool]:
    """(the keyword parameters `fn` names, whether it also takes ``**kwargs``)."""
    params = inspect.signature(fn).parameters.values()
    named = [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    return named, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def plugin_modules() -> list[str]:
    """Modules outside agentrl that registered something here, for a process that must see
    the same registrations (the learner process imports them). ``__main__`` is left out:
    a script's top level cannot be imported elsewhere without running it again."""
    mods = set()
    registries = (
        ADVANTAGES,
        POLICY_LOSSES,
        KL_ESTIMATORS,
        AGGREGATIONS,
        TREE_ATTRIBUTIONS,
        OFF_POLICY_MASKS,
    )
    for reg in registries:
        for fn in reg._fns.values():
            mod = getattr(fn, "__module__", None) or ""
            if mod and mod != "__main__" and mod.split(".")[0] != "agentrl":
                mods.add(mod)
    return sorted(mods)
