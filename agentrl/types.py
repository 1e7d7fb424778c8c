"""Core data types: token-exact trajectories and the tensors the learner trains on.

Token in, token out: the ids a sampler produced are the ids the learner trains on.
A trajectory is an ordered list of :class:`Segment` s, each from one source:

* ``prompt``      -- the rendered system prompt, tools and first user turn (not trained),
* ``model``       -- tokens the policy sampled (trained; carry behaviour logprobs + version),
* ``observation`` -- tool results / environment messages rendered as token deltas (not trained).

Alignment convention used everywhere (types, algos, learner): per-token arrays are aligned
with ``input_ids``; ``behavior_logprobs[t]`` is ``log p(input_ids[t] | input_ids[:t])``
under the weights that sampled it, and is 0.0 where ``loss_mask[t] == 0``. The learner
shifts logits by one to compute the same quantity.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Self

SegmentKind = Literal["prompt", "model", "observation"]
TrajectoryStatus = Literal["ok", "truncated", "infra_error"]
NO_VERSION = -1  # version of tokens not produced by the policy

# weights for a sampler or a transport: a state dict, or a safetensors file or folder
WeightsLike = Mapping[str, Any] | str | Path


@dataclass
class Segment:
    """A run of tokens from one source."""

    kind: SegmentKind
    token_ids: list[int]
    logprobs: list[float] | None = None  # behaviour logprobs, model segments only
    versions: list[int] | None = None  # weight version per token, model segments only
    entropies: list[float] | None = None  # optional per-token entropy (model segments)
    text: str | None = None  # decoded text, for traces only (never re-tokenized)
    # model segments: how many leading tokens a decoding constraint placed (the gateway's
    # forced tool call): context for the tokens after them, left out of the loss
    forced: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("prompt", "model", "observation"):
            raise ValueError(
                f"Segment.kind must be 'prompt', 'model' or 'observation' (got {self.kind!r})"
            )
        n = len(self.token_ids)
        if self.kind == "model":
            if self.logprobs is None or self.versions is None:
                raise ValueError("a model Segment needs logprobs and versions for every token")
            if len(self.logprobs) != n or len(self.versions) != n:
                raise ValueError(
                    f"model Segment lengths differ: {n} token_ids, {len(self.logprobs)} "
                    f"logprobs, {len(self.versions)} versions"
                )
        if self.entropies is not None and len(self.entropies) != n:
            raise ValueError(f"Segment has {n} tokens but {len(self.entropies)} entropies")
        if self.forced is not None and not (self.kind == "model" and 0 <= self.forced <= n):
            raise ValueError(f"Segment.forced must count leading model tokens (got {self.forced})")

    def __len__(self) -> int:
        return len(self.token_ids)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Segment:
        return cls(**d)


@dataclass
class ToolCallRecord:
    """One tool call made in a turn, as recorded in the trace."""

    name: str
    arguments: dict[str, Any] | str  # str when the model's JSON did not parse
    result: str = ""  # the observation text (possibly truncated for the trace)
    result_chars: int = 0
    latency_s: float = 0.0
    error: str | None = None  # parse / validation / tool error shown to the model
    infra_error: bool = False  # the platform failed, not the agent
    timed_out: bool = False  # the call exceeded its tool timeout (an error observation)


@dataclass
class Turn:
    """One assistant turn: what was generated and which tools ran."""

    index: int
    generated_tokens: int = 0
    finish_reason: str = ""
    text: str = ""
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    gen_latency_s: float = 0.0
    observation_tokens: int = 0
    # what the sampler does with in-flight rows on a weight update (``sampler.on_update``:
    # keep | reprefill | drain; None when the backend does not say) and how many context
    # tokens it re-prefilled under new weights while generating this turn (None: not counted)
    on_update: str | None = None
    reprefilled_tokens: int | None = None
    # the environment's own reward for this step, never the outcome (StepResult.step_reward;
    # None: not scored here) and a key of the state the agent acted from
    # (Environment.state_key(); None: not given)
    step_reward: float | None = None
    state: str | None = None
    # the weighted sum of reward.process functions and reward.process_model on this turn
    # (None: none configured)
    process_reward: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in (
            "step_reward",
            "state",
            "process_reward",
        ):  # absent in traces written before they existed
            if d[key] is None:
                del d[key]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Turn:
        d = dict(d)
        d["tool_calls"] = [ToolCallRecord(**c) for c in d.get("tool_calls", [])]
        return cls(**d)


class SegmentViews:
    """Token-aligned views of ``self.segments`` (a trajectory, a transcript being built)."""

    segments: list[Segment]

    @property
    def input_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        out: list[int] = []
        for s in self.segments:
            if s.kind != "model":
                out.extend([0] * len(s))
            else:  # tokens a constraint forced are context, not the policy's choice
                out.extend([0] * (s.forced or 0) + [1] * (len(s) - (s.forced or 0)))
        return out


class JsonLine:
    """One line of a JSONL file: ``to_json`` / ``from_json`` over ``to_dict`` / ``from_dict``."""

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - each class defines it
        raise NotImplementedError

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:  # pragma: no cover - each class defines it
        raise NotImplementedError

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Self:
        return cls.from_dict(json.loads(line))


@dataclass
class Trajectory(JsonLine, SegmentViews):
    """One sampled episode (or one leaf of a branch tree)."""

    segments: list[Segment] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    # the outcome (StepResult.outcome or Environment.reward(), composed by the reward
    # section); step rewards are on the turns (Turn.step_reward), never summed in here
    reward: float = 0.0
    reward_info: dict[str, Any] = field(default_factory=dict)
    status: TrajectoryStatus = "ok"
    task_id: str = ""
    group_id: str = ""
    traj_id: str = ""
    parent_id: str | None = None  # for branches: the trajectory this one forked from
    branch_position: int | None = None  # token index in input_ids where the branch starts
    error: str | None = None  # infra error message, if any
    metadata: dict[str, Any] = field(default_factory=dict)

    # --- derived views (aligned with input_ids) --------------------------------------

    @property
    def behavior_logprobs(self) -> list[float]:
        out: list[float] = []
        for s in self.segments:
            out.extend(s.logprobs if s.kind == "model" else [0.0] * len(s))  # type: ignore[arg-type]
        return out

    @property
    def versions(self) -> list[int]:
        out: list[int] = []
        for s in self.segments:
            out.extend(s.versions if s.kind == "model" else [NO_VERSION] * len(s))  # type: ignore[arg-type]
        return out

    @property
    def prompt_length(self) -> int:
        """Tokens before the first model token."""
        n = 0
        for s in self.segments:
            if s.kind == "model":
                break
            n += len(s)
        return n

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.segments)

    @property
    def num_model_tokens(self) -> int:
        return sum(len(s) for s in self.segments if s.kind == "model")

    @property
    def response_length(self) -> int:
        """Tokens after the prompt (model + observation), the length DAPO's shaping uses."""
        return self.num_tokens - self.prompt_length

    @property
    def oldest_version(self) -> int | None:
        vs = [v for s in self.segments if s.kind == "model" for v in s.versions or []]
        return min(vs) if vs else None

    @property
    def num_tool_calls(self) -> int:
        return sum(len(t.tool_calls) for t in self.turns)

    @property
    def turn_spans(self) -> list[tuple[int, int]]:
        """``(start, end)`` token ranges in ``input_ids`` of each model segment (one per
        assistant turn), end exclusive."""
        spans, pos = [], 0
        for s in self.segments:
            if s.kind == "model":
                spans.append((pos, pos + len(s)))
            pos += len(s)
        return spans

    @property
    def process_rewards(self) -> list[float]:
        """Per assistant turn, the environment's step reward (0.0 where a turn was not
        scored) plus the turn's ``process_reward`` (``reward.process`` functions,
        ``reward.process_model``). The outcome ``reward`` is never among them."""
        n = len(self.turn_spans)
        out = [0.0] * n
        for k, turn in enumerate(self.turns[:n]):
            if turn.step_reward is not None:
                out[k] = float(turn.step_reward)
            if turn.process_reward is not None:
                out[k] += float(turn.process_reward)
        return out

    @property
    def turn_states(self) -> list[str | None]:
        """Per assistant turn, the key of the state the agent acted from (None: unknown)."""
        n = len(self.turn_spans)
        states: list[str | None] = [t.state for t in self.turns[:n]]
        return states + [None] * (n - len(states))

    # --- serialisation ----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("segments", "turns")}
        d["segments"] = [s.to_dict() for s in self.segments]
        d["turns"] = [t.to_dict() for t in self.turns]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d["segments"] = [Segment.from_dict(s) for s in d.get("segments", [])]
        d["turns"] = [Turn.from_dict(t) for t in d.get("turns", [])]
        metadata = dict(d.get("metadata") or {})
        outcome_turn = metadata.pop("outcome_turn", None)
        if outcome_turn is not None:  # written before the split: that step reward was the outcome
            d["metadata"] = metadata
            if 0 <= outcome_turn < len(d["turns"]):
                d["turns"][outcome_turn].step_reward = None
        return cls(**d)


@dataclass
class TrajectoryGroup(JsonLine):
    """The G samples for one task (a tree when branching is on)."""

    task_id: str
    trajectories: list[Trajectory]
    task: dict[str, Any] = field(default_factory=dict)
    group_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    @property
    def oldest_version(self) -> int | None:
        vs = [v for t in self.trajectories if (v := t.oldest_version) is not None]
        return min(vs) if vs else None

    @property
    def is_tree(self) -> bool:
        return any(t.parent_id is not None for t in self.trajectories)

    def valid(self) -> list[Trajectory]:
        """Trajectories that count for training (infra failures excluded)."""
        return [t for t in self.trajectories if t.status != "infra_error"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "group_id": self.group_id,
            "task": self.task,
            "metadata": self.metadata,
            "trajectories": [t.to_dict() for t in self.trajectories],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrajectoryGroup:
        return cls(
            task_id=d["task_id"],
            group_id=d.get("group_id", ""),
            task=d.get("task", {}),
            metadata=d.get("metadata", {}),
            trajectories=[Trajectory.from_dict(t) for t in d["trajectories"]],
        )


@dataclass
class Batch:
    """Right-padded tensors for the learner, built from groups.

    Shapes: ``[B, T]`` for per-token fields, ``[B]`` for per-sequence fields. Per-token
    fields follow the alignment convention of this module. ``group_index`` maps each row
    to its group (0..G-1) so advantage estimators can work with ``scatter``/``index_add``.
    ``valid`` is 0 for ``infra_error`` rows: they leave the loss and their group's baseline.
    """

    input_ids: Any  # LongTensor [B, T]
    attention_mask: Any  # LongTensor [B, T]
    loss_mask: Any  # FloatTensor [B, T]
    behavior_logprobs: Any  # FloatTensor [B, T]
    versions: Any  # LongTensor [B, T] (NO_VERSION outside model tokens)
    rewards: Any  # FloatTensor [B]: outcomes (Trajectory.reward)
    group_index: Any  # LongTensor [B]
    valid: Any  # FloatTensor [B]
    response_lengths: Any  # LongTensor [B]
    trajectories: list[Trajectory] = field(default_factory=list, repr=False)
    advantages: Any = None  # FloatTensor [B] or [B, T], set by the learner
    # turns (K = most assistant turns of a row): the last token of each turn in input_ids
    # (-1 past a row's turns), the step and process rewards per turn, never the outcome
    # (Trajectory.process_rewards, 0 past a row's turns), 1.0 on real turns, and the state
    # keys (Trajectory.turn_states)
    turn_ends: Any = None  # LongTensor [B, K]
    turn_rewards: Any = None  # FloatTensor [B, K]
    turn_mask: Any = None  # FloatTensor [B, K]
    turn_states: list[list[str | None]] = field(default_factory=list, repr=False)

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def from_groups(
        cls,
        groups: Sequence[TrajectoryGroup],
        pad_token_id: int = 0,
        pad_to_multiple_of: int = 1,
    ) -> Batch:
        import torch

        trajs: list[Trajectory] = []
        gidx: list[int] = []
        for g_i, g in enumerate(groups):
            for t in g.trajectories:
                trajs.append(t)
                gidx.append(g_i)
        if not trajs:
            raise ValueError("cannot build a Batch from zero trajectories")
        lengths = [t.num_tokens for t in trajs]
        T = max(lengths)
        if pad_to_multiple_of > 1:
            T = -(-T // pad_to_multiple_of) * pad_to_multiple_of
        B = len(trajs)
        input_ids = torch.full((B, T), pad_token_id, dtype=torch.long)
        attention = torch.zeros((B, T), dtype=torch.long)
        loss_mask = torch.zeros((B, T), dtype=torch.float32)
        blp = torch.zeros((B, T), dtype=torch.float32)
        versions = torch.full((B, T), NO_VERSION, dtype=torch.long)
        for i, t in enumerate(trajs):
            n = lengths[i]
            input_ids[i, :n] = torch.tensor(t.input_ids, dtype=torch.long)
            attention[i, :n] = 1
            loss_mask[i, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
            blp[i, :n] = torch.tensor(t.behavior_logprobs, dtype=torch.float32)
            versions[i, :n] = torch.tensor(t.versions, dtype=torch.long)
        valid = torch.tensor([0.0 if t.status == "infra_error" else 1.0 for t in trajs])
        loss_mask = loss_mask * valid[:, None]
        spans = [t.turn_spans for t in trajs]
        K = max(1, max(len(s) for s in spans))
        turn_ends = torch.full((B, K), -1, dtype=torch.long)
        turn_rewards = torch.zeros((B, K), dtype=torch.float32)
        turn_mask = torch.zeros((B, K), dtype=torch.float32)
        for i, (t, row) in enumerate(zip(trajs, spans, strict=True)):
            if row:
                turn_ends[i, : len(row)] = torch.tensor([end - 1 for _, end in row])
                turn_rewards[i, : len(row)] = torch.tensor(t.process_rewards, dtype=torch.float32)
                turn_mask[i, : len(row)] = 1.0
        return cls(
            input_ids=input_ids,
            attention_mask=attention,
            loss_mask=loss_mask,
            behavior_logprobs=blp,
            versions=versions,
            rewards=torch.tensor([t.reward for t in trajs], dtype=torch.float32),
            group_index=torch.tensor(gidx, dtype=torch.long),
            valid=valid,
            response_lengths=torch.tensor([t.response_length for t in trajs], dtype=torch.long),
            trajectories=trajs,
            turn_ends=turn_ends,
            turn_rewards=turn_rewards,
            turn_mask=turn_mask,
            turn_states=[t.turn_states for t in trajs],
        )
