"""The teachers of on-policy distillation (``distill``), and how a row finds its own.

    teachers = Teachers(settings.distill, tokenizer, device=device)
    keys = teachers.row_keys(groups)                    # per row: the teacher that scores it
    teacher_lp = teachers.logprobs(batch, keys, score)  # [B, T], on the trained tokens

A teacher is a model run in the learner's process (an alias or a model folder; it must
share the policy's tokenizer, since it scores the student's token ids as they are) or an
OpenAI-compatible server that returns prompt log-probs (vLLM's ``prompt_logprobs`` on
``/v1/completions``). It needs nothing but token ids, so it scores whatever was sampled:
rows of an older weight version in an asynchronous run, rows an agent program produced
through the gateway. The advantage it makes is :func:`agentrl.algos.distill.distill_advantages`.

A local teacher computes at the sampler's temperature (the learner's forward); vLLM's
prompt log-probs are of the raw distribution (temperature 1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from agentrl.errors import ConfigError, SamplerError
from agentrl.learner.settings import DistillSettings, TeacherSettings
from agentrl.types import Batch, TrajectoryGroup

log = logging.getLogger(__name__)

DEFAULT_KEY = "default"  # distill.teacher's key: the tasks that name none
PROBE_TEXT = "Distillation probe: 12 + 30 = 42, def f(x): return x ** 2"


def check_same_tokenizer(label: str, teacher: Any, student: Any) -> None:
    """Refuse a teacher whose vocabulary differs from the student's: it would score other
    tokens than the ones sampled. `label` names the config key."""
    t_vocab, s_vocab = teacher.get_vocab(), student.get_vocab()
    if t_vocab == s_vocab:
        return
    differ = sorted(
        tok for tok in set(t_vocab) | set(s_vocab) if t_vocab.get(tok) != s_vocab.get(tok)
    )
    raise ConfigError(
        f"{label}: the teacher's tokenizer differs from the policy's ({len(t_vocab)} vs "
        f"{len(s_vocab)} tokens, {len(differ)} entries differ, e.g. {differ[:3]}): on-policy "
        "distillation scores the student's own token ids, so the teacher must share model.name's "
        "tokenizer; pick a teacher of the same family (or distil offline with agentrl sft)"
    )


class ServerTeacher:
    """Prompt log-probs from an OpenAI-compatible ``/v1/completions`` server (vLLM):
    ``prompt`` is the token ids, ``max_tokens: 1``, ``prompt_logprobs: 0``; the answer's
    ``choices[i].prompt_logprobs[t]`` maps token ids (as strings) to ``{"logprob": ...}``
    and always holds the prompt's own token at ``t`` (``None`` at 0)."""

    def __init__(
        self,
        settings: TeacherSettings,
        label: str,
        *,
        batch_rows: int = 16,
        transport: Any = None,
    ) -> None:
        import httpx

        assert settings.base_url is not None
        url = settings.base_url.rstrip("/")
        self.api_url = url if url.endswith("/v1") else url + "/v1"
        self.label = label
        self.batch_rows = batch_rows
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        # transport: an httpx transport a test injects (None: the network)
        self.client = httpx.Client(timeout=settings.timeout_s, headers=headers, transport=transport)
        self.model = settings.model or self._served_model()

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        import httpx

        try:
            r = self.client.post(f"{self.api_url}{path}", json=body)
        except httpx.HTTPError as e:
            raise SamplerError(f"{self.label}: teacher server {self.api_url} failed: {e}") from e
        if r.status_code != 200:
            raise SamplerError(
                f"{self.label}: teacher server answered {r.status_code} on {path}: "
                f"{r.text[:300]} (it must accept prompt_logprobs on /v1/completions, as vLLM does)"
            )
        return r.json()

    def _served_model(self) -> str:
        import httpx

        try:
            data = self.client.get(f"{self.api_url}/models").json()
            return str(data["data"][0]["id"])
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
            raise ConfigError(
                f"{self.label}: could not list the teacher server's models at "
                f"{self.api_url}/models ({e}): set its model name ({self.label}.model)"
            ) from e

    def check_tokenizer(self, student: Any) -> None:
        """Compare the server's tokenization of a probe text with the student's (vLLM's
        ``/tokenize``); a server without that endpoint is trusted, with a warning."""
        import httpx

        root = self.api_url.removesuffix("/v1")
        try:
            r = self.client.post(
                f"{root}/tokenize", json={"model": self.model, "prompt": PROBE_TEXT}
            )
        except httpx.HTTPError:
            r = None
        if r is None or r.status_code != 200:
            log.warning(
                "%s: the teacher server has no /tokenize; its tokenizer is unchecked", self.label
            )
            return
        theirs = list(r.json().get("tokens", []))
        ours = student(PROBE_TEXT, add_special_tokens=False)["input_ids"]
        if theirs[-len(ours) :] != ours:  # a BOS the server adds is fine
            raise ConfigError(
                f"{self.label}: the teacher server tokenizes differently from the policy "
                f"({theirs[:8]} vs {ours[:8]} for {PROBE_TEXT!r}): on-policy distillation "
                "needs the same tokenizer"
            )

    def score(self, sequences: Sequence[list[int]]) -> list[list[float]]:
        """Per sequence, the log-prob of each token given the ones before (0.0 at 0)."""
        out: list[list[float]] = []
        for start in range(0, len(sequences), self.batch_rows):
            chunk = [list(map(int, s)) for s in sequences[start : start + self.batch_rows]]
            body = {
                "model": self.model,
                "prompt": chunk,
                "max_tokens": 1,
                "temperature": 1.0,
                "prompt_logprobs": 0,
            }
            choices = self._post("/completions", body).get("choices")
            if not isinstance(choices, list) or len(choices) != len(chunk):
                raise SamplerError(f"{self.label}: malformed completions answer: {choices!r:.300}")
            for choice, ids in zip(
                sorted(choices, key=lambda c: c.get("index", 0)), chunk, strict=True
            ):
                out.append(_prompt_logprobs(choice, ids, self.label))
        return out

    def close(self) -> None:
        self.client.close()


def _prompt_logprobs(choice: dict[str, Any], ids: list[int], label: str) -> list[float]:
    entries = choice.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(ids):
        raise SamplerError(
            f"{label}: the teacher server returned no prompt_logprobs for {len(ids)} tokens "
            f"(got {str(entries)[:200]}); it must support prompt_logprobs (vLLM does)"
        )
    lps = [0.0]
    for t in range(1, len(ids)):
        entry = entries[t] or {}
        found = entry.get(str(ids[t]), entry.get(ids[t]))  # type: ignore[call-overload]
        if found is None:
            raise SamplerError(f"{label}: prompt_logprobs[{t}] lacks the prompt's token {ids[t]}")
        lps.append(float(found["logprob"] if isinstance(found, dict) else found))
    return lps


class Teachers:
    """The run's teachers by key: ``distill.teacher`` under :data:`DEFAULT_KEY`, and
    ``distill.teachers``; a task's ``distill.task_key`` field names its teacher."""

    def __init__(
        self,
        settings: DistillSettings,
        tokenizer: Any,
        *,
        device: torch.device,
        wrap: Callable[[Any], Any] = lambda m: m,
        transport: Any = None,
    ) -> None:
        self.settings = settings
        specs = dict(settings.teachers)
        if settings.teacher is not None:
            specs.setdefault(DEFAULT_KEY, settings.teacher)
        self.local: dict[str, Any] = {}
        self.servers: dict[str, ServerTeacher] = {}
        for key, spec in specs.items():
            label = "distill.teacher" if key == DEFAULT_KEY else f"distill.teachers.{key}"
            if spec.base_url:
                server = ServerTeacher(spec, label, transport=transport)
                if tokenizer is not None:
                    server.check_tokenizer(tokenizer)
                self.servers[key] = server
            elif spec.model:
                self.local[key] = wrap(_load_local(spec.model, label, tokenizer, device))
            else:
                raise ConfigError(f"{label}: name a model (folder or alias) or a base_url")

    @property
    def keys(self) -> list[str]:
        return [*self.local, *self.servers]

    def row_keys(self, groups: Sequence[TrajectoryGroup]) -> list[str]:
        """Each row's teacher, in :meth:`Batch.from_groups`'s row order."""
        field = self.settings.task_key
        out = []
        for g in groups:
            named = g.task.get(field) if isinstance(g.task, dict) else None
            key = DEFAULT_KEY if named is None else str(named)
            if key not in self.local and key not in self.servers:
                have = ", ".join(self.keys)
                raise ConfigError(
                    f"task {g.task_id!r} names teacher {key!r} (its {field!r} field) but "
                    f"distill has only [{have}]: add distill.teachers.{key}, or distill.teacher "
                    "for tasks that name none"
                )
            out.extend([key] * len(g.trajectories))
        return out

    def logprobs(
        self, batch: Batch, keys: Sequence[str], score_local: Callable[[Any, Tensor], Tensor]
    ) -> Tensor:
        """The teachers' log-probs ``[B, T]`` on `batch`'s trained rows (0 elsewhere);
        `score_local(model, rows)` runs a local teacher's no-grad forward on `rows`."""
        B, T = batch.input_ids.shape
        out = torch.zeros(B, T)
        trained = batch.loss_mask.sum(dim=1) > 0
        for key in dict.fromkeys(keys):
            rows = torch.tensor(
                [i for i, k in enumerate(keys) if k == key and bool(trained[i])], dtype=torch.long
            )
            if not len(rows):
                continue
            if key in self.local:
                out[rows] = score_local(self.local[key], rows).float().cpu()[rows]
            else:
                lengths = batch.attention_mask.sum(dim=1)
                seqs = [batch.input_ids[i, : int(lengths[i])].tolist() for i in rows.tolist()]
                for i, lps in zip(rows.tolist(), self.servers[key].score(seqs), strict=True):
                    out[i, : len(lps)] = torch.tensor(lps)
        return out * (batch.loss_mask > 0)

    def close(self) -> None:
        for server in self.servers.values():
            server.close()


def _load_local(name: str, label: str, tokenizer: Any, device: torch.device) -> Any:
    from agentrl.models import load_model

    model, teacher_tokenizer = load_model(name, dtype="float32", device=device)
    if tokenizer is not None:
        check_same_tokenizer(label, teacher_tokenizer, tokenizer)
    model.config.use_cache = False
    return model.eval().requires_grad_(False)
