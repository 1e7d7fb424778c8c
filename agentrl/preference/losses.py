"""Preference losses: pure functions over per-sequence log-probs, each registered by name.

    @register_preference_loss("my_loss")                     # paired, with a reference
    def my_loss(pi: PairLogps, *, beta: float = 0.1) -> PreferenceLoss: ...

A paired loss gets :class:`PairLogps` (``w`` = chosen / winner, ``l`` = rejected / loser, as
in the papers); an unpaired one (``unpaired=True``, KTO) gets :class:`UnpairedLogps`. Both
hold summed token log-probs ``log pi(y|x)`` ``[B]`` over the trained tokens, the number of
those tokens (for length-normalised losses) and, unless ``reference=False``, the frozen
reference's log-probs. Options (``beta`` and the rest) reach a loss through the keyword
parameters it names; an unknown one is an error naming the ones it takes.

Every loss returns the scalar loss and its implicit rewards per example (detached), from
which the trainer logs margins and preference accuracy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from agentrl.algos.registry import keyword_parameters
from agentrl.errors import ConfigError
from agentrl.registry import Registry

Fn = TypeVar("Fn", bound=Callable[..., Any])


@dataclass
class PairLogps:
    """Summed log-probs of the chosen (``w``) and rejected (``l``) completions, ``[B]``."""

    logp_w: Tensor
    logp_l: Tensor
    len_w: Tensor  # trained tokens of y_w
    len_l: Tensor
    ref_logp_w: Tensor | None = None
    ref_logp_l: Tensor | None = None
    # sequential KL D_SeqKL(x, y; pi_ref || pi) = sum over trained tokens t of
    # KL(pi_ref(.|x, y_<t) || pi(.|x, y_<t)), [B]; only for losses registered token_kl=True
    seq_kl_w: Tensor | None = None
    seq_kl_l: Tensor | None = None


@dataclass
class UnpairedLogps:
    """Completions labelled desirable or not (KTO), ``[B]``; ``kl_*``: the same prompts
    with mismatched completions ``(x_i, y_j)``, for the batch's KL estimate."""

    logp: Tensor
    length: Tensor
    desirable: Tensor  # bool
    ref_logp: Tensor
    kl_logp: Tensor
    kl_ref_logp: Tensor


@dataclass
class PreferenceLoss:
    loss: Tensor  # scalar
    chosen_rewards: Tensor  # [B] implicit reward of y_w (KTO: of each completion)
    rejected_rewards: Tensor  # [B] implicit reward of y_l (KTO: empty)
    metrics: dict[str, float]


class PreferenceLossRegistry(Registry[Callable[..., PreferenceLoss]]):
    """Preference losses, each marked with whether it needs a reference model, whether it
    reads unpaired rows and whether it needs the reference's per-token distribution."""

    def __init__(self) -> None:
        super().__init__("preference_loss")
        self._reference: dict[str, bool] = {}
        self._unpaired: dict[str, bool] = {}
        self._token_kl: dict[str, bool] = {}

    def register(  # type: ignore[override]
        self,
        name: str,
        *,
        override: bool = False,
        reference: bool = True,
        unpaired: bool = False,
        token_kl: bool = False,
    ) -> Callable[[Fn], Fn]:
        """Register ``fn(logps: PairLogps | UnpairedLogps, **options) -> PreferenceLoss``.

        ``reference=False``: no reference log-probs are computed (ORPO, SimPO);
        ``unpaired=True``: ``fn`` gets :class:`UnpairedLogps` (pairs are split into a
        desirable and an undesirable row); ``token_kl=True``: ``fn`` also gets the sequential
        KLs ``seq_kl_w`` / ``seq_kl_l`` (TDPO), for which the trainer keeps a frozen copy of the
        reference model and forwards it every step."""
        if token_kl and (unpaired or not reference):
            raise ValueError(
                f"preference loss {name!r}: token_kl needs a paired loss with a reference"
            )
        add = super().register(name, override=override)

        def deco(fn: Fn) -> Fn:
            add(fn)
            self._reference[name] = reference
            self._unpaired[name] = unpaired
            self._token_kl[name] = token_kl
            return fn

        return deco

    def token_kl(self, name: str) -> bool:
        self.get(name)
        return self._token_kl[name]

    def needs_reference(self, name: str) -> bool:
        self.get(name)
        return self._reference[name]

    def unpaired(self, name: str) -> bool:
        self.get(name)
        return self._unpaired[name]


PREFERENCE_LOSSES = PreferenceLossRegistry()


register_preference_loss = PREFERENCE_LOSSES.register  # ``@register_preference_loss("name")``


def check_options(name: str, options: dict[str, Any]) -> None:
    """An option `name` does not take is a one-line error naming the ones it does."""
    named, anything = keyword_parameters(PREFERENCE_LOSSES.get(name))
    accepted = [n for n in named if n not in ("pi", "logps")]
    unknown = sorted(set(options) - set(accepted))
    if unknown and not anything:
        raise ConfigError(
            f"preference loss {name!r} takes no option {unknown[0]!r}; its options: "
            f"{', '.join(accepted) or 'none'} (set them with --set preference.options.KEY=V "
            "or preference.beta)"
        )


def preference_loss(name: str, logps: PairLogps | UnpairedLogps, **options: Any) -> PreferenceLoss:
    """The loss `name` on `logps` with `options` (``None`` values are left to the loss)."""
    fn = PREFERENCE_LOSSES.get(name)
    options = {k: v for k, v in options.items() if v is not None}
    check_options(name, options)
    return fn(logps, **options)


def _need_reference(pi: PairLogps, name: str) -> tuple[Tensor, Tensor]:
    if pi.ref_logp_w is None or pi.ref_logp_l is None:
        raise ValueError(f"{name} needs the reference log-probs ref_logp_w and ref_logp_l")
    return pi.ref_logp_w, pi.ref_logp_l


def _out(loss: Tensor, r_w: Tensor, r_l: Tensor, **metrics: float) -> PreferenceLoss:
    return PreferenceLoss(loss, r_w.detach(), r_l.detach(), metrics)


# DPO, Rafailov et al. 2023, Eq. 7:
#   L = -log sigma(beta log pi(y_w|x)/pi_ref(y_w|x) - beta log pi(y_l|x)/pi_ref(y_l|x));
# with label smoothing eps, conservative DPO (Mitchell 2023):
#   L = -(1 - eps) log sigma(beta h) - eps log sigma(-beta h)
@register_preference_loss("dpo")
def dpo(pi: PairLogps, *, beta: float = 0.1, label_smoothing: float = 0.0) -> PreferenceLoss:
    ref_w, ref_l = _need_reference(pi, "dpo")
    r_w = beta * (pi.logp_w - ref_w)  # implicit rewards
    r_l = beta * (pi.logp_l - ref_l)
    eps = label_smoothing
    loss = -(1 - eps) * F.logsigmoid(r_w - r_l) - eps * F.logsigmoid(r_l - r_w)
    return _out(loss.mean(), r_w, r_l)


# cDPO (Mitchell 2023): DPO with labels flipped with probability eps (label_smoothing)
@register_preference_loss("cdpo")
def cdpo(pi: PairLogps, *, beta: float = 0.1, label_smoothing: float = 0.1) -> PreferenceLoss:
    return dpo(pi, beta=beta, label_smoothing=label_smoothing)


# Robust DPO, Chowdhury et al. 2024, Eq. 8 (an unbiased loss under label noise eps):
#   L = [(1 - eps) (-log sigma(beta h)) - eps (-log sigma(-beta h))] / (1 - 2 eps)
@register_preference_loss("robust")
def robust_dpo(pi: PairLogps, *, beta: float = 0.1, label_smoothing: float = 0.1) -> PreferenceLoss:
    eps = label_smoothing
    if not 0 <= eps < 0.5:
        raise ConfigError(f"robust DPO needs 0 <= label_smoothing < 0.5 (got {eps})")
    ref_w, ref_l = _need_reference(pi, "robust")
    r_w = beta * (pi.logp_w - ref_w)
    r_l = beta * (pi.logp_l - ref_l)
    loss = ((1 - eps) * -F.logsigmoid(r_w - r_l) + eps * F.logsigmoid(r_l - r_w)) / (1 - 2 * eps)
    return _out(loss.mean(), r_w, r_l)


# RPO (Iterative RPO, Pang et al. 2024, arXiv 2404.19733: DPO plus the winner's NLL):
#   L = L_DPO + alpha * L_NLL,  L_NLL = -log pi(y_w|x) / |y_w|  (length-normalised, per pair);
#   alpha weighs the NLL term, as TRL's rpo_alpha does (1: the two terms summed)
@register_preference_loss("rpo")
def rpo(pi: PairLogps, *, beta: float = 0.1, alpha: float = 1.0) -> PreferenceLoss:
    if alpha < 0:
        raise ConfigError(f"rpo: preference.options.alpha must be >= 0 (got {alpha})")
    out = dpo(pi, beta=beta)
    nll = (-pi.logp_w / pi.len_w.clamp(min=1)).mean()
    return _out(
        out.loss + alpha * nll, out.chosen_rewards, out.rejected_rewards, nll=float(nll.detach())
    )


# IPO, Azar et al. 2023, Eq. 17 (tau is the regularisation, written beta here):
#   h = log [pi(y_w|x) pi_ref(y_l|x)] / [pi(y_l|x) pi_ref(y_w|x)],  L = (h - 1/(2 tau))^2
# length_normalize averages the log-probs over tokens first (what TRL's "ipo" does)
@register_preference_loss("ipo")
def ipo(pi: PairLogps, *, beta: float = 0.1, length_normalize: bool = False) -> PreferenceLoss:
    tau = beta
    ref_w, ref_l = _need_reference(pi, "ipo")
    logp_w, logp_l = pi.logp_w, pi.logp_l
    if length_normalize:
        logp_w, logp_l = logp_w / pi.len_w, logp_l / pi.len_l
        ref_w, ref_l = ref_w / pi.len_w, ref_l / pi.len_l
    h = (logp_w - ref_w) - (logp_l - ref_l)
    loss = (h - 1 / (2 * tau)) ** 2
    return _out(loss.mean(), tau * (logp_w - ref_w), tau * (logp_l - ref_l))


# SLiC-HF hinge, Zhao et al. 2023, Eq. 1 (on the DPO log-ratio, as TRL's "hinge"):
#   L = max(0, 1 - beta h)
@register_preference_loss("hinge")
def hinge(pi: PairLogps, *, beta: float = 0.1) -> PreferenceLoss:
    ref_w, ref_l = _need_reference(pi, "hinge")
    r_w = beta * (pi.logp_w - ref_w)
    r_l = beta * (pi.logp_l - ref_l)
    return _out(torch.relu(1 - (r_w - r_l)).mean(), r_w, r_l)


# ORPO, Hong et al. 2024, Eqs. 4-7: P(y|x) = exp(mean token log-prob),
#   odds(y|x) = P / (1 - P),  L_OR = -log sigma(log odds(y_w|x) / odds(y_l|x)),
#   L = L_SFT + lambda L_OR   (L_SFT: token-mean NLL of y_w over the batch)
@register_preference_loss("orpo", reference=False)
def orpo(pi: PairLogps, *, lam: float = 0.1, beta: float | None = None) -> PreferenceLoss:
    lam = beta if beta is not None else lam  # TRL calls lambda "beta"
    mean_w, mean_l = pi.logp_w / pi.len_w, pi.logp_l / pi.len_l  # log P(y|x)
    log_odds_w = mean_w - torch.log1p(-torch.exp(mean_w))
    log_odds_l = mean_l - torch.log1p(-torch.exp(mean_l))
    L_or = -F.logsigmoid(log_odds_w - log_odds_l)
    L_sft = -pi.logp_w.sum() / pi.len_w.sum()
    loss = L_sft + lam * L_or.mean()
    return _out(
        loss,
        lam * mean_w,
        lam * mean_l,
        nll=float(L_sft.detach()),
        log_odds_ratio=float((log_odds_w - log_odds_l).detach().mean()),
    )


# SimPO, Meng et al. 2024, Eq. 6:
#   L = -log sigma(beta/|y_w| log pi(y_w|x) - beta/|y_l| log pi(y_l|x) - gamma)
@register_preference_loss("simpo", reference=False)
def simpo(
    pi: PairLogps, *, beta: float = 2.0, gamma: float = 0.5, label_smoothing: float = 0.0
) -> PreferenceLoss:
    r_w = beta * pi.logp_w / pi.len_w
    r_l = beta * pi.logp_l / pi.len_l
    eps = label_smoothing
    margin = r_w - r_l - gamma
    loss = -(1 - eps) * F.logsigmoid(margin) - eps * F.logsigmoid(-margin)
    return _out(loss.mean(), r_w, r_l)


# TDPO, Zeng et al. 2024 (Token-level DPO, Sec. 4: L_TDPO1 and L_TDPO2):
#   u = beta log pi(y_w|x)/pi_ref(y_w|x) - beta log pi(y_l|x)/pi_ref(y_l|x)
#   delta = beta D_SeqKL(x, y_l; pi_ref || pi) - beta D_SeqKL(x, y_w; pi_ref || pi)
#   TDPO1: L = -log sigma(u - delta)
#   TDPO2: L = -log sigma(u - alpha delta_2), delta_2 = the same with sg(D_SeqKL(x, y_w)):
#   no gradient through the chosen side's KL (the paper's recommended form; alpha 0.5)
@register_preference_loss("tdpo", token_kl=True)
def tdpo(
    pi: PairLogps, *, beta: float = 0.1, alpha: float = 0.5, variant: int = 2
) -> PreferenceLoss:
    if variant not in (1, 2):
        raise ConfigError(f"tdpo: preference.options.variant must be 1 or 2 (got {variant!r})")
    ref_w, ref_l = _need_reference(pi, "tdpo")
    if pi.seq_kl_w is None or pi.seq_kl_l is None:
        raise ValueError("tdpo needs the sequential KLs seq_kl_w and seq_kl_l")
    r_w = beta * (pi.logp_w - ref_w)
    r_l = beta * (pi.logp_l - ref_l)
    u = r_w - r_l
    if variant == 1:
        delta = beta * (pi.seq_kl_l - pi.seq_kl_w)
    else:
        delta = alpha * beta * (pi.seq_kl_l - pi.seq_kl_w.detach())
    loss = -F.logsigmoid(u - delta)
    return _out(
        loss.mean(),
        r_w,
        r_l,
        seq_kl_chosen=float(pi.seq_kl_w.detach().mean()),
        seq_kl_rejected=float(pi.seq_kl_l.detach().mean()),
    )


# KTO, Ethayarajh et al. 2024, Eq. 8:
#   r(x,y) = log pi(y|x)/pi_ref(y|x),  z_0 = max(0, KL(pi || pi_ref)) estimated on the batch's
#   mismatched pairs (x_i, y_j) and not back-propagated,
#   v = lambda_D sigma(beta (r - z_0)) if y is desirable, lambda_U sigma(beta (z_0 - r)) if not,
#   L = E[lambda_y - v(x, y)]
@register_preference_loss("kto", unpaired=True)
def kto(
    pi: UnpairedLogps, *, beta: float = 0.1, lambda_d: float = 1.0, lambda_u: float = 1.0
) -> PreferenceLoss:
    r = pi.logp - pi.ref_logp
    z_0 = (pi.kl_logp - pi.kl_ref_logp).mean().clamp(min=0).detach()
    desirable = pi.desirable.bool()
    v = torch.where(
        desirable,
        lambda_d * torch.sigmoid(beta * (r - z_0)),
        lambda_u * torch.sigmoid(beta * (z_0 - r)),
    )
    lambda_y = torch.where(desirable, torch.full_like(r, lambda_d), torch.full_like(r, lambda_u))
    loss = (lambda_y - v).mean()
    rewards = beta * r
    return PreferenceLoss(loss, rewards.detach(), rewards.new_zeros(0), {"kl": float(z_0)})
