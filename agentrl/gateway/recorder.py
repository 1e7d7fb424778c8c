"""One episode's calls recorded token for token: samples that grow, and prefix breaks.

A :class:`Session` belongs to one episode (one API key). Every call is matched against
the samples recorded so far:

* **extension** -- the request's messages are a sample's messages so far plus our last
  reply (as the agent echoes it back) plus new non-assistant messages (tool results, a
  user turn), with the same tools. The prompt sent to the sampler is then the sample's
  ids *as sampled* followed by the rendered delta of the new messages
  (:meth:`ChatRenderer.observation_ids`, masked); nothing is re-tokenised.
* **break** -- anything else (the agent rewrote or truncated its history, switched the
  system prompt or the tools, retried a call): the request is rendered whole and starts a
  new sample of the same group. Its reason is recorded and counted.

Completions-API calls extend a sample when the new prompt (ids, or text) starts with the
sample's prompt + completion. ``n > 1`` choices beyond the first start samples of their
own from the same prompt. :meth:`Session.trajectories` proves every chat sample's prefix
with the renderer's check before it leaves.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.chat import ChatRenderer
from agentrl.errors import TemplateMismatchError
from agentrl.gateway.convert import Message, MessageKey, Reply, message_key, render_message
from agentrl.gateway.protocol import ChatMessage, OpenAIError, bad_request
from agentrl.gateway.tree import Link, SubagentCredit, link, main_line, tree_rows
from agentrl.samplers.base import Generation
from agentrl.types import Segment, ToolCallRecord, Trajectory, Turn

RESULT_CHARS = 2000  # tool results kept in the trace per call


@dataclass
class Sample:
    """One trajectory being recorded (a conversation the agent keeps extending)."""

    kind: Literal["chat", "completion"]
    reason: str  # why it started: "first", "choice 2 of 3", or the prefix break
    segments: list[Segment]
    renderer: ChatRenderer | None = None  # chat: the renderer of this sample's tools
    tools_key: str = ""
    messages: list[Message] = field(default_factory=list)  # what the template renders
    keys: list[MessageKey] = field(default_factory=list)  # request messages + our replies
    text: str = ""  # completion: prompt + completions as text, for text prompts
    turns: list[Turn] = field(default_factory=list)
    calls: dict[str, ToolCallRecord] = field(default_factory=dict)  # tool_call_id -> record
    last_model_ids: list[int] | None = None
    busy: bool = False  # a call on it is being sampled
    link: Link = field(default_factory=Link)  # where it came from (agentrl.gateway.tree)
    last_call: int = 0  # the session's call count at its latest call

    @property
    def input_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.segments)

    @property
    def response_tokens(self) -> int:
        return self.num_tokens - len(self.segments[0])

    def fork(self, reason: str) -> Sample:
        """A new sample holding this one's tokens so far (segments are never mutated)."""
        new = copy.copy(self)
        new.reason, new.busy = reason, False
        new.segments, new.messages, new.keys = (
            list(self.segments),
            list(self.messages),
            list(self.keys),
        )
        new.turns, new.calls = copy.deepcopy(self.turns), dict(self.calls)
        return new


@dataclass
class Plan:
    """Where a call's prompt comes from, decided before sampling."""

    prompt_ids: list[int]
    base: Sample  # extended in place (extension) or a fresh sample not yet in the session
    extends: bool
    observation_ids: list[int] = field(default_factory=list)
    new_messages: list[Message] = field(default_factory=list)
    keys: list[MessageKey] = field(default_factory=list)
    text: str = ""


class Session:
    """The calls of one episode: samples, replies, prefix breaks and limits."""

    def __init__(
        self,
        key: str,
        *,
        seed: int | None = None,
        max_calls: int | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.key = key
        self.seed = seed
        self.max_calls = max_calls
        self.max_tokens = max_tokens  # response tokens of one sample
        self.samples: list[Sample] = []
        self.recorded: dict[MessageKey, str] = {}  # our replies' keys -> model text
        self.calls = 0
        self.breaks: list[str] = []
        self.truncation: str | None = None  # a limit the agent ran into
        self.last_reply: str = ""
        self.closed = False
        self.models: dict[str, int] = {}  # model names the agent asked for -> calls
        self.last_sample: Sample | None = None  # the sample of the latest call
        # Responses API: response id -> its conversation, for previous_response_id
        self.responses: dict[str, list[ChatMessage]] = {}

    # --- limits ------------------------------------------------------------------------------

    def next_seed(self, requested: int | None) -> int | None:
        if requested is not None:
            return requested
        if self.seed is None:
            return None
        return (self.seed * 1_000_003 + self.calls * 7919) % (2**31)

    def count_call(self) -> None:
        if self.max_calls is not None and self.calls >= self.max_calls:
            self.truncation = f"call limit reached (rollout.max_turns={self.max_calls})"
            raise bad_request(
                f"this episode has made its {self.max_calls} model calls "
                "(rollout.max_turns); finish the episode",
                code="turn_limit_reached",
            )
        self.calls += 1

    def note_model(self, name: str) -> None:
        """Record the model name a call asked for (any name reaches the policy)."""
        self.models[name] = self.models.get(name, 0) + 1

    def token_budget(self, plan: Plan) -> int | None:
        """Response tokens the call may still sample in its sample; None = unbounded."""
        if self.max_tokens is None:
            return None
        used = (plan.base.response_tokens if plan.extends else 0) + len(plan.observation_ids)
        left = self.max_tokens - used
        if left < 1:
            self.truncation = f"token budget exhausted (rollout.max_tokens={self.max_tokens})"
            raise bad_request(
                f"this conversation has used its {self.max_tokens} response tokens "
                "(rollout.max_tokens); finish the episode or start a shorter conversation",
                code="token_budget_exhausted",
            )
        return left

    # --- chat -----------------------------------------------------------------------------

    def plan_chat(
        self, messages: list[ChatMessage], renderer: ChatRenderer, tools_key: str
    ) -> Plan:
        keys = [message_key(m) for m in messages]
        for sample in reversed(self.samples):
            if sample.kind != "chat" or sample.busy or sample.tools_key != tools_key:
                continue
            n = len(sample.keys)
            if len(keys) <= n or keys[:n] != sample.keys:
                continue
            rest = messages[n:]
            if any(m.role == "assistant" for m in rest):
                continue  # the agent wrote a model turn itself: not what was sampled
            new = [render_message(m, self.recorded) for m in rest]
            try:
                obs = renderer.observation_ids(sample.messages, new, sample.last_model_ids)
            except TemplateMismatchError:
                continue  # the template renders this history differently: a break
            return Plan(
                prompt_ids=sample.input_ids + obs,
                base=sample,
                extends=True,
                observation_ids=obs,
                new_messages=new,
                keys=keys,
            )
        rendered = [render_message(m, self.recorded) for m in messages]
        if rendered[-1]["role"] == "assistant":
            raise bad_request(
                "the last message is an assistant message: continuing a partial assistant "
                "turn is not supported; end with a user, tool or system message",
                param="messages",
            )
        prompt = renderer.prompt_ids(rendered)
        fresh = Sample(
            kind="chat",
            reason=self._why_new(keys, tools_key),
            segments=[Segment("prompt", prompt)],
            renderer=renderer,
            tools_key=tools_key,
            messages=rendered,
            keys=keys,
        )
        return Plan(prompt_ids=prompt, base=fresh, extends=False, keys=keys)

    def _why_new(self, keys: list[MessageKey], tools_key: str) -> str:
        chats = [s for s in self.samples if s.kind == "chat"]
        if not chats:
            return "first"
        last = chats[-1]
        if tools_key != last.tools_key:
            return "prefix break: the tools changed"
        if keys[0] != last.keys[0]:
            return "prefix break: the first (system) message changed"
        if len(keys) <= len(last.keys) and keys == last.keys[: len(keys)]:
            return "prefix break: the history was truncated or the call repeated"
        i = next((i for i, (a, b) in enumerate(zip(keys, last.keys, strict=False)) if a != b), -1)
        if i >= 0 and last.keys[i][0] == "assistant":
            return f"prefix break: the agent changed the model's reply (message {i})"
        if i >= 0:
            return f"prefix break: message {i} was rewritten"
        return "prefix break: the agent wrote an assistant message itself"

    def commit_chat(
        self, plan: Plan, gens: list[Generation], replies: list[Reply], latency_s: float
    ) -> None:
        base = plan.base
        if self._extend(plan):
            base.messages.extend(plan.new_messages)
            self._fill_tool_results(base, plan.new_messages)
            base.keys = list(plan.keys)
        choices = self._choices(base, gens, [r.text for r in replies], latency_s)
        for sample, reply in zip(choices, replies, strict=True):
            sample.messages.append({"role": "assistant", "content": reply.text})
            sample.keys.append(reply.key())
            self.recorded[reply.key()] = reply.text
            turn = sample.turns[-1]
            for call, record in zip(reply.tool_calls, reply.parsed, strict=True):
                rec = ToolCallRecord(name=record.name, arguments=record.arguments)
                turn.tool_calls.append(rec)
                sample.calls[call["id"]] = rec
        self.last_reply = replies[0].text

    def _fill_tool_results(self, sample: Sample, new_messages: list[Message]) -> None:
        for msg in new_messages:
            rec = sample.calls.get(msg.get("tool_call_id") or "")
            if msg.get("role") == "tool" and rec is not None:
                content = str(msg.get("content") or "")
                rec.result, rec.result_chars = content[:RESULT_CHARS], len(content)

    # --- completions -------------------------------------------------------------------------

    def plan_completion(self, prompt: str | list[int], renderer: ChatRenderer) -> Plan:
        for sample in reversed(self.samples):
            if sample.kind != "completion" or sample.busy:
                continue
            if isinstance(prompt, list):
                tip = sample.input_ids
                if len(prompt) > len(tip) and prompt[: len(tip)] == tip:
                    obs = list(prompt[len(tip) :])
                    return Plan(tip + obs, sample, True, observation_ids=obs)
            elif sample.text and len(prompt) > len(sample.text) and prompt.startswith(sample.text):
                obs = renderer.encode(prompt[len(sample.text) :])
                return Plan(sample.input_ids + obs, sample, True, observation_ids=obs, text=prompt)
        ids = list(prompt) if isinstance(prompt, list) else renderer.encode(prompt)
        if not ids:
            raise bad_request("the prompt is empty", param="prompt")
        text = "" if isinstance(prompt, list) else prompt
        done = [s for s in self.samples if s.kind == "completion"]
        reason = "prefix break: the prompt does not extend the last one" if done else "first"
        fresh = Sample(kind="completion", reason=reason, segments=[Segment("prompt", ids)])
        fresh.text = text
        return Plan(ids, fresh, False, text=text)

    def commit_completion(
        self, plan: Plan, gens: list[Generation], texts: list[str], latency_s: float
    ) -> None:
        base = plan.base
        if self._extend(plan):
            base.text = plan.text if plan.text else ""
        for sample, text in zip(self._choices(base, gens, texts, latency_s), texts, strict=True):
            # a token-id prompt cannot be extended by text: keep text only when it came as text
            sample.text = sample.text + text if sample.text else ""
        self.last_reply = texts[0]

    # --- shared ------------------------------------------------------------------------------

    def _extend(self, plan: Plan) -> bool:
        """Whether the call extends its sample (then its observation tokens are appended);
        otherwise the sample is new and is recorded."""
        base = plan.base
        if not plan.extends:
            self._add(base)
            return False
        base.segments.append(Segment("observation", plan.observation_ids))
        if base.turns:
            base.turns[-1].observation_tokens = len(plan.observation_ids)
        return True

    def _choices(
        self, base: Sample, gens: list[Generation], texts: list[str], latency_s: float
    ) -> list[Sample]:
        """One sample per generated choice, each with its model tokens: the first continues
        `base`, the others fork from where `base` stood before this call."""
        start = base.fork(base.reason) if len(gens) > 1 else None
        samples = []
        for i, (gen, text) in enumerate(zip(gens, texts, strict=True)):
            sample = base if i == 0 else start.fork(f"choice {i + 1} of {len(gens)}")  # type: ignore[union-attr]
            if i > 0:
                self._add(sample, forked_from=base)
            self._append_model(sample, gen, text, latency_s)
            sample.last_call = self.calls
            samples.append(sample)
        self.last_sample = samples[0]
        return samples

    def _add(self, sample: Sample, forked_from: Sample | None = None) -> None:
        if sample.reason.startswith("prefix break"):
            self.breaks.append(sample.reason)
        sample.link = link(self.samples, sample, forked_from)
        self.samples.append(sample)

    @staticmethod
    def _append_model(sample: Sample, gen: Generation, text: str, latency_s: float) -> None:
        sample.segments.append(gen.segment(text, forced=gen.metadata.get("forced_tokens") or None))
        sample.turns.append(gen.turn(len(sample.turns), text, latency_s))
        sample.last_model_ids = list(gen.token_ids)

    def trajectories(
        self, template: Trajectory, credit: SubagentCredit = "all"
    ) -> list[Trajectory]:
        """The recorded samples as trajectories (ids from `template`), prefixes proven;
        `credit` ``main``: only the main line's (:mod:`agentrl.gateway.tree`).

        Raises :class:`TemplateMismatchError` when a chat sample fails the prefix check."""
        out: list[Trajectory] = []
        keep = [
            i for i, s in enumerate(self.samples) if any(seg.kind == "model" for seg in s.segments)
        ]
        last = self.samples.index(self.last_sample) if self.last_sample in self.samples else None
        line = main_line([s.link for s in self.samples], last)
        tree = tree_rows(self.samples, keep, line)
        samples = [self.samples[i] for i in keep]
        for k, sample in enumerate(samples):
            row = tree[k]
            if credit == "main" and not row["main"]:
                continue  # off the main line: not trained, kept in the tree
            meta: dict[str, Any] = {
                "gateway": {
                    "sample": k,
                    "samples": len(samples),
                    "calls": self.calls,
                    "prefix_breaks": len(self.breaks),
                    "started_by": sample.reason,
                    "api": sample.kind,
                    "models": dict(self.models),  # the names the agent asked for
                    "parent": row["parent"],
                    "relation": row["relation"],
                    "main": row["main"],
                    "credit": credit,
                    "tree": tree,
                }
            }
            if sample.kind == "chat" and sample.renderer is not None:
                check = sample.renderer.check_prefix(
                    sample.messages, sample.segments, raise_on_mismatch=False
                )
                if not check.ok:
                    raise TemplateMismatchError(check.message)
                meta["exact_tokens"] = bool(check.exact_tokens)
            traj = Trajectory(
                segments=list(sample.segments),
                turns=sample.turns,
                task_id=template.task_id,
                group_id=template.group_id,
                traj_id=template.traj_id if not out else f"{template.traj_id}.s{k}",
                metadata={**template.metadata, **meta},
            )
            if self.truncation is not None:
                traj.status = "truncated"
                traj.metadata["truncation"] = self.truncation
            out.append(traj)
        return out


def require_open(session: Session | None, key: str) -> Session:
    if session is None or session.closed:
        raise OpenAIError(
            401,
            "Incorrect API key provided: this key belongs to no open agentrl episode (each "
            "episode gets its own key and base URL; it expires when the episode ends).",
            type="authentication_error",
            code="invalid_api_key",
        )
    return session
