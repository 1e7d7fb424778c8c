"""The sampler contract shared by every backend (hf, vllm, openai).

Behaviour log-probs: for each sampled token, ``log softmax(logits / temperature)`` at that
token, computed *before* top-p / top-k truncation. This is exactly what the learner
recomputes (it divides logits by the same temperature), so the sampler-vs-learner gap is
numerical only. With temperature 0 (greedy), logits are used unscaled.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from agentrl.types import Segment, Turn, WeightsLike

if TYPE_CHECKING:
    from agentrl.samplers.settings import SamplerSettings

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # stop strings (the stop string is kept in the output)
    seed: int | None = None
    n: int = 1  # samples per prompt (generate_many)
    return_entropy: bool = False
    # no later request resends this sequence (an episode's last allowed turn): a sampler
    # with a prefix cache keeps none of its completion's keys/values (the prompt's still)
    last_turn: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, 0 disables it (got {self.top_k})")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1 (got {self.max_new_tokens})")
        if self.n < 1:
            raise ValueError(f"n must be >= 1 (got {self.n})")

    def with_(self, **changes: Any) -> SamplingParams:
        return replace(self, **changes)


@dataclass
class Generation:
    """What one sampled continuation produced."""

    token_ids: list[int]
    logprobs: list[float]  # behaviour logprob of each sampled token (see module doc)
    versions: list[int]  # weight version that produced each token
    finish_reason: FinishReason
    entropies: list[float] | None = None  # per-token entropy (nats) when requested
    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.token_ids)

    def segment(self, text: str, **more: Any) -> Segment:
        """The model segment of this continuation: its tokens exactly as sampled."""
        return Segment(
            "model",
            list(self.token_ids),
            logprobs=list(self.logprobs),
            versions=list(self.versions),
            text=text,
            **more,
        )

    def turn(self, index: int, text: str, latency_s: float, **more: Any) -> Turn:
        """The trajectory's record of this continuation as its turn ``index``."""
        return Turn(
            index=index,
            generated_tokens=len(self.token_ids),
            finish_reason=self.finish_reason,
            text=text,
            gen_latency_s=latency_s,
            on_update=self.metadata.get("on_update"),
            reprefilled_tokens=self.metadata.get("reprefilled_tokens"),
            **more,
        )


class Sampler(abc.ABC):
    """Produces tokens, their behaviour log-probs and the weight version of each token.

    Every backend declares ``version``, ``context_length`` and ``vocab_size``; the rollout
    reads them, it never probes for backend attributes. ``stats()`` is optional (empty).
    Each backend maps a run's sampler settings to its own options (:meth:`from_settings`), and declares
    what ``sampler.on_update: auto`` means for it and the policies it cannot honour.
    """

    backend: str = "base"
    weight_payload: str = "state_dict"  # what the WeightBus hands to update_weights
    on_update_default: ClassVar[str] = "keep"  # sampler.on_update=auto, nothing drains
    on_update_cannot: ClassVar[dict[str, str]] = {}  # policy -> why this backend cannot

    @classmethod
    def options_from_settings(cls, settings: SamplerSettings) -> dict[str, Any]:
        """The keyword options `settings` give this backend (:mod:`agentrl.samplers.options`)."""
        raise NotImplementedError(f"the {cls.backend} sampler has no options_from_settings")

    @classmethod
    def from_settings(cls, settings: SamplerSettings) -> Sampler:
        """The sampler `settings` ask for (blocking: may load a model)."""
        raise NotImplementedError(f"the {cls.backend} sampler has no from_settings")

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """Version of the weights currently used for new tokens."""

    @property
    @abc.abstractmethod
    def context_length(self) -> int | None:
        """Most tokens one sequence may hold (prompt + generated); None when unknown."""

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """|V|, the model's output dimension (normalises entropies, bounds token ids)."""

    def stats(self) -> dict[str, float]:
        """Counters of the backend for the metrics log (rows decoded, tokens, ...)."""
        return {}

    @property
    def tokenizer(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    @abc.abstractmethod
    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Sample one continuation of `prompt_ids` (params.n must be 1)."""

    async def generate_many(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> list[Generation]:
        """Sample `params.n` continuations concurrently."""
        import anyio

        results: list[Generation | None] = [None] * params.n
        one = params.with_(n=1)

        async def _one(i: int) -> None:
            p = one if one.seed is None else one.with_(seed=one.seed + i)
            results[i] = await self.generate(prompt_ids, p)

        async with anyio.create_task_group() as tg:
            for i in range(params.n):
                tg.start_soon(_one, i)
        return [r for r in results if r is not None]

    @abc.abstractmethod
    async def update_weights(self, weights: WeightsLike, version: int) -> None:
        """Swap to new weights (a state dict or a safetensors folder) tagged `version`.

        Versions only go up. On a bad update (missing/extra keys, shape mismatch) raise
        :class:`agentrl.errors.WeightUpdateError` and keep the previous weights and version.
        """

    async def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release engine resources."""

    async def __aenter__(self) -> Sampler:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
