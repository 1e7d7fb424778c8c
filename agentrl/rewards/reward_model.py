"""A learned reward: a Bradley–Terry reward model scores finished episodes.

    reward:
      model: runs/rm                # a folder written by `agentrl rm train` (or any HF
      model_weight: 1.0             # AutoModelForSequenceClassification with num_labels=1)

The conversation is rendered with the reward model's own chat template (the one it was
trained with) and scored on its last token. Scoring is batched: episodes that finish while
a batch is in the forward pass wait together and go in the next one; the forward runs in a
worker thread, on ``reward.model_device``, so the event loop keeps serving tools and
samplers. With ``algorithm.kl_in_reward`` the learner subtracts the per-token KL penalty
from this outcome reward (the classic RLHF reward, see docs/bring_your_own.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from agentrl.chat import load_template
from agentrl.errors import ConfigError, ModelLoadError

Message = dict[str, Any]


def check_reward_model_folder(path: str | Path, field: str = "reward.model") -> dict[str, Any]:
    """The folder's config.json, if it holds a one-output sequence-classification model;
    otherwise a :class:`ConfigError` saying what it holds and how to get a reward model."""
    folder = Path(path).expanduser()
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ConfigError(
            f"{field} {str(path)!r} is not a model folder (no config.json): train one with "
            "`agentrl rm train prefs.jsonl --model <base> --out <folder>`"
        )
    config = json.loads(config_file.read_text())
    archs = config.get("architectures") or []
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise ConfigError(
            f"{field} {str(path)!r} holds a {', '.join(archs) or 'model without architectures'}"
            ", not a reward model (an AutoModelForSequenceClassification head with "
            "num_labels=1): train one with `agentrl rm train prefs.jsonl --model <base>`"
        )
    # transformers leaves its default (two labels) out of config.json
    labels = config.get("num_labels") or len(config.get("id2label") or {}) or 2
    if labels != 1:
        raise ConfigError(
            f"{field} {str(path)!r} has a classification head with {labels} labels; a "
            "reward model outputs one score (num_labels=1, as `agentrl rm train` writes)"
        )
    return config


def render_for_reward(tokenizer: Any, messages: Sequence[Message]) -> str:
    """The text a reward model reads for a conversation: its chat template (trained and
    scored the same way), or agentrl's ChatML template when the tokenizer has none."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        template = load_template("hermes_chatml")[1]
    return tokenizer.apply_chat_template(
        list(messages), chat_template=template, tokenize=False, add_generation_prompt=False
    )


def encode_batch(tokenizer: Any, texts: Sequence[str], max_length: int) -> dict[str, Any]:
    """Right-padded ids; too long texts lose their beginning (the score is on the end)."""
    tokenizer.padding_side = "right"
    tokenizer.truncation_side = "left"
    return tokenizer(
        list(texts),
        return_tensors="pt",
        padding=True,
        truncation=True,
        max_length=max_length,
        add_special_tokens=False,
    )


def ensure_pad_token(tokenizer: Any, model: Any) -> None:
    """Batched sequence classification needs a pad token the model knows (its last real
    token is found from it)."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id


@dataclass
class _Request:
    text: str
    done: anyio.Event = field(default_factory=anyio.Event)
    value: float | None = None
    error: BaseException | None = None


class RewardModelScorer:
    """Scores conversations with a reward model folder, batched and off the event loop."""

    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "auto",
        batch_size: int = 16,
        max_length: int = 2048,
    ) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        check_reward_model_folder(path)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(path))
            self.model = AutoModelForSequenceClassification.from_pretrained(str(path))
        except Exception as e:
            raise ModelLoadError(f"could not load reward model {str(path)!r}: {e}") from e
        self.model.to(device).eval()
        ensure_pad_token(self.tokenizer, self.model)
        self.device = device
        self.batch_size = batch_size
        self.max_length = max_length
        self._pending: list[_Request] = []
        self._lock = anyio.Lock()
        self.batches = 0  # forward passes so far (batching is visible in tests and metrics)

    def score_texts(self, texts: Sequence[str]) -> list[float]:
        """Scores of rendered texts (blocking: call it from a worker thread)."""
        import torch

        enc = encode_batch(self.tokenizer, texts, self.max_length).to(self.device)
        with torch.inference_mode():
            logits = self.model(**enc).logits
        self.batches += 1
        return logits[:, 0].float().tolist()

    async def score(self, messages: Sequence[Message]) -> float:
        """The reward model's score of a finished conversation.

        Requests that arrive while a batch is running wait and go together in the next one;
        whoever takes the lock next runs it (no background task to outlive the run)."""
        request = _Request(render_for_reward(self.tokenizer, messages))
        self._pending.append(request)
        while not request.done.is_set():
            async with self._lock:
                if request.done.is_set():
                    break
                batch = self._pending[: self.batch_size]
                del self._pending[: len(batch)]
                try:
                    values = await anyio.to_thread.run_sync(
                        self.score_texts, [r.text for r in batch]
                    )
                except Exception as e:  # every waiter of this batch sees the failure
                    for r in batch:
                        r.error = e
                        r.done.set()
                    raise
                except BaseException:  # this caller was cancelled: the others go next time
                    self._pending[:0] = [r for r in batch if r is not request]
                    raise
                for r, v in zip(batch, values, strict=True):
                    r.value = v
                    r.done.set()
        if request.error is not None:
            raise request.error
        assert request.value is not None
        return request.value

    async def aclose(self) -> None:
        self.model = None  # type: ignore[assignment]
