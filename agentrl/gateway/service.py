"""The gateway without HTTP: sessions, sampling parameters, recording, response bodies.

    gateway = Gateway(sampler, gateway_settings(cfg, training=True))  # agentrl.run.settings
    session = gateway.open_session(seed=7)
    body = await gateway.chat(session, ChatCompletionRequest(**payload))
    trajectories = gateway.close_session(session.key).trajectories(template)

:mod:`agentrl.gateway.server` puts this behind FastAPI. Sampling goes through the run's
sampler as for built-in episodes, so a weight update while an agent is mid-call follows
the sampler's rules (partial rollouts: the call continues on the new weights and its
tokens carry both versions; ``on_update: drain``: it finishes on the old ones). The call
waits for the swap; it never fails because of it. The OpenAI response bodies are built in
:mod:`agentrl.gateway.openai_bodies`; sessions record in :mod:`agentrl.gateway.recorder`.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.errors import AgentRLError, PromptError
from agentrl.gateway.convert import Reply, reply_from_text, tool_schemas, tools_key
from agentrl.gateway.forcing import forced_name, opening_text, single_call_stop, with_forced
from agentrl.gateway.openai_bodies import Completed, OpenAIBodies
from agentrl.gateway.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    bad_request,
)
from agentrl.gateway.recorder import Plan, Session, require_open
from agentrl.gateway.tree import SubagentCredit
from agentrl.samplers.base import Generation, Sampler, SamplingParams

RENDERER_CACHE = 64  # distinct tool lists kept rendered
LATENCY_WINDOW = 100_000  # per-call overheads kept for percentiles

__all__ = ["Completed", "Gateway", "GatewaySettings", "GatewayStats"]


@dataclass(frozen=True)
class GatewaySettings:
    """How the gateway serves (a run's: :func:`agentrl.run.settings.gateway_settings`)."""

    # the names /v1/models lists; a request may name any model (agent programs keep the
    # name they were written with, e.g. gpt-4o-mini: it reaches the policy and is recorded
    # in the trace) unless strict_model, which answers other names 404 model_not_found
    model_names: tuple[str, ...] = ("agentrl",)
    strict_model: bool = False
    chat_template: str | None = None  # model.chat_template
    temperature: float = 1.0  # defaults for parameters a request leaves out
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    # training: the learner recomputes log-probs at sampler.temperature, so a request may
    # not sample at another one (its behaviour log-probs would not match)
    lock_temperature: bool = True
    max_n: int = 4
    tool_parser: str = "hermes"
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port
    open_sessions: bool = False  # `agentrl serve`: any key opens a session
    # which samples of an episode get its reward: all, or the main line only
    # (sub-agents, side calls and what compaction left behind are not trained)
    subagent_credit: SubagentCredit = "all"


@dataclass
class GatewayStats:
    calls: int = 0
    errors: int = 0
    prefix_breaks: int = 0
    sessions_opened: int = 0
    overhead_s: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))


class Gateway(OpenAIBodies):
    """OpenAI-compatible chat and completions over one sampler, recorded per session."""

    def __init__(self, sampler: Sampler, settings: GatewaySettings | None = None) -> None:
        self.sampler = sampler
        self.settings = settings or GatewaySettings()
        self.tokenizer = sampler.tokenizer
        self.sessions: dict[str, Session] = {}
        self.stats = GatewayStats()
        self.base_url = ""  # set by the server once it listens
        self.closing = False
        # tool list -> (renderer, its stop ids): the stop ids read the whole vocabulary
        self._renderers: OrderedDict[str, tuple[ChatRenderer, tuple[int, ...]]] = OrderedDict()
        self._plain = self._renderer(None)[0]

    # --- sessions ----------------------------------------------------------------------------

    def open_session(
        self,
        *,
        key: str | None = None,
        seed: int | None = None,
        max_calls: int | None = None,
        max_tokens: int | None = None,
    ) -> Session:
        """A new episode's session under a fresh secret key (or `key`)."""
        key = key or f"sk-agentrl-{secrets.token_urlsafe(18)}"
        if key in self.sessions:
            raise ValueError(f"a session with key {key!r} is already open")
        session = Session(key, seed=seed, max_calls=max_calls, max_tokens=max_tokens)
        self.sessions[key] = session
        self.stats.sessions_opened += 1
        return session

    def close_session(self, key: str) -> Session:
        """Forget the session (its key stops working); returns it for its trajectories."""
        session = self.sessions.pop(key)
        session.closed = True
        self.stats.prefix_breaks += len(session.breaks)
        return session

    def session_for(self, key: str | None) -> Session:
        """The open session of `key` (401 otherwise; opened on demand when serving)."""
        key = key or ""
        session = self.sessions.get(key)
        if session is None and self.settings.open_sessions and not self.closing:
            session = self.open_session(key=key or "default")
        return require_open(session, key)

    def session_url(self, session: Session) -> str:
        """The episode's own base URL (its key is in the path, so any api_key works)."""
        return f"{self.base_url}/s/{session.key}/v1"

    def session_root(self, session: Session) -> str:
        """The base URL for clients that add ``/v1`` themselves (Anthropic's:
        ``ANTHROPIC_BASE_URL``)."""
        return f"{self.base_url}/s/{session.key}"

    # --- request checks ----------------------------------------------------------------------

    def check_model(self, name: str) -> None:
        """Any name reaches the policy unless ``strict_model`` (then only `model_names`)."""
        if self.settings.strict_model and name not in self.settings.model_names:
            raise OpenAIError(
                404,
                f"The model `{name}` does not exist or you do not have access to it "
                f"(served: {', '.join(self.settings.model_names)}; this gateway is strict "
                "about model names: strict_model=false lets any name reach the policy).",
                param="model",
                code="model_not_found",
            )

    def _check_common(self, req: ChatCompletionRequest | CompletionRequest) -> None:
        if self.closing:
            raise OpenAIError(
                503, "the gateway is shutting down", type="server_error", code="shutting_down"
            )
        self.check_model(req.model)
        if req.n > self.settings.max_n:
            raise bad_request(
                f"n={req.n} is more than this gateway allows ({self.settings.max_n}); "
                "raise the agent env's max_n option",
                param="n",
                code="invalid_value",
            )
        locked = self.settings.lock_temperature
        if locked and req.temperature is not None and req.temperature != self.settings.temperature:
            raise bad_request(
                f"temperature={req.temperature} differs from the run's sampler.temperature="
                f"{self.settings.temperature}: the learner recomputes log-probs at the run's "
                "temperature; omit temperature or change sampler.temperature",
                param="temperature",
                code="invalid_value",
            )

    def _renderer(self, tools: list[Any] | None) -> tuple[ChatRenderer, str, tuple[int, ...]]:
        schemas = tool_schemas(tools)
        key = tools_key(schemas)
        cached = self._renderers.get(key)
        if cached is None:
            try:
                renderer = ChatRenderer(
                    self.tokenizer, tools=schemas, template=self.settings.chat_template
                )
            except AgentRLError as e:
                raise bad_request(f"the tools cannot be rendered: {e}", param="tools") from e
            cached = self._renderers[key] = (renderer, tuple(renderer.stop_token_ids))
            if len(self._renderers) > RENDERER_CACHE:
                self._renderers.popitem(last=False)
        else:
            self._renderers.move_to_end(key)
        return cached[0], key, cached[1]

    def _params(
        self,
        req: ChatCompletionRequest | CompletionRequest,
        session: Session,
        plan: Plan,
        stop_token_ids: tuple[int, ...],
        forced: int = 0,
    ) -> SamplingParams:
        s = self.settings
        context = self.sampler.context_length
        prompt_len = len(plan.prompt_ids) + forced
        if context is not None and prompt_len >= context:
            raise bad_request(
                f"This model's maximum context length is {context} tokens. However, your "
                f"messages resulted in {prompt_len} tokens. Please reduce the length of the "
                "messages.",
                param="messages" if isinstance(req, ChatCompletionRequest) else "prompt",
                code="context_length_exceeded",
            )
        limit = req.token_limit if isinstance(req, ChatCompletionRequest) else req.max_tokens
        cap = (limit or s.max_new_tokens) - forced  # forced tokens are part of the reply
        if context is not None:
            cap = min(cap, context - prompt_len)
        budget = session.token_budget(plan)
        if budget is not None:
            cap = min(cap, budget - forced)
        if cap < 1:
            raise bad_request(
                f"no tokens left to sample after the {forced} tokens of the forced tool-call "
                "opening: raise max_tokens or drop tool_choice",
                param="max_tokens",
                code="invalid_value",
            )
        stop = req.stop_strings
        one_call = isinstance(req, ChatCompletionRequest) and req.parallel_tool_calls is False
        if one_call and req.tools and req.tool_choice != "none":  # type: ignore[union-attr]
            stop = (*stop, single_call_stop(s.tool_parser))
        return SamplingParams(
            temperature=s.temperature if req.temperature is None else req.temperature,
            top_p=s.top_p if req.top_p is None else req.top_p,
            top_k=s.top_k if req.top_k is None else req.top_k,
            max_new_tokens=cap,
            stop_token_ids=stop_token_ids,
            stop=stop,
            seed=session.next_seed(req.seed),
            n=req.n,
        )

    async def _sample(self, prompt_ids: list[int], params: SamplingParams) -> list[Generation]:
        try:
            if params.n == 1:
                return [await self.sampler.generate(prompt_ids, params)]
            return await self.sampler.generate_many(prompt_ids, params)
        except PromptError as e:
            raise bad_request(str(e), code="context_length_exceeded") from e

    async def _generate(
        self, plan: Plan, params: SamplingParams, forced: list[int] | None = None
    ) -> tuple[list[Generation], float]:
        """(generations, seconds) for ``plan``, continuing `forced` ids (then at the head of
        each generation); no other call builds on its base meanwhile."""
        plan.base.busy = True
        forced = forced or []
        try:
            t_gen = time.perf_counter()
            gens = await self._sample(plan.prompt_ids + forced, params)
            gens = [with_forced(g, forced, self.sampler.version) for g in gens]
            return gens, time.perf_counter() - t_gen
        finally:
            plan.base.busy = False

    # --- the two APIs ------------------------------------------------------------------------

    async def chat(
        self, session: Session, req: ChatCompletionRequest, *, call_ids: str = "call_"
    ) -> Completed:
        """Serve one chat completion and record it in `session` (tool-call ids start with
        `call_ids`: the Messages API names them ``toolu_``)."""
        t0 = time.perf_counter()
        self._check_common(req)
        req.check_supported()
        renderer, tkey, stop_ids = self._renderer(req.tools)
        forced = self.forced_ids(req, renderer)
        session.count_call()
        session.note_model(req.model)
        plan = session.plan_chat(req.messages, renderer, tkey)
        params = self._params(req, session, plan, stop_ids, len(forced))
        gens, gen_s = await self._generate(plan, params, forced)
        parse = bool(req.tools) and req.tool_choice != "none"
        replies = []
        for gen in gens:
            reply = reply_from_text(
                renderer.decode(gen.token_ids), parse, self.settings.tool_parser, call_ids
            )
            if not reply.tool_calls and req.stop_strings and gen.finish_reason == "stop":
                reply.content = _strip_stop(reply.text, req.stop_strings)
            replies.append(reply)
        session.commit_chat(plan, gens, replies, gen_s)
        self._account(t0, gen_s)
        return Completed(plan.prompt_ids, gens, replies, int(time.time()), _new_id("chatcmpl"))

    def forced_ids(self, req: ChatCompletionRequest, renderer: ChatRenderer) -> list[int]:
        """The tool-call opening a forcing ``tool_choice`` puts before sampling (or none)."""
        must, name = forced_name(req.tool_choice, [t.function.name for t in req.tools or []])
        if not must:
            return []
        return renderer.encode(opening_text(self.settings.tool_parser, name))

    def count_tokens(self, session: Session, req: ChatCompletionRequest) -> int:
        """The prompt tokens `req` would be sampled after, without sampling or recording."""
        req.check_supported()
        renderer, tkey, _ = self._renderer(req.tools)
        plan = session.plan_chat(req.messages, renderer, tkey)
        self.forced_ids(req, renderer)  # a tool_choice that cannot be honoured: 400 here too
        return len(plan.prompt_ids)

    async def complete(self, session: Session, req: CompletionRequest) -> Completed:
        """Serve one (text) completion and record it in `session`."""
        t0 = time.perf_counter()
        self._check_common(req)
        req.check_supported()
        session.count_call()
        session.note_model(req.model)
        plan = session.plan_completion(req.single_prompt(), self._plain)
        params = self._params(req, session, plan, ())
        gens, gen_s = await self._generate(plan, params)
        texts = [
            self.tokenizer.decode(
                g.token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
            )
            for g in gens
        ]
        session.commit_completion(plan, gens, texts, gen_s)
        replies = [Reply(text=t, content=t) for t in texts]
        if req.stop_strings:
            for r, g in zip(replies, gens, strict=True):
                if g.finish_reason == "stop":
                    r.content = _strip_stop(r.text, req.stop_strings)
        self._account(t0, gen_s)
        return Completed(plan.prompt_ids, gens, replies, int(time.time()), _new_id("cmpl"))

    def _account(self, t0: float, gen_s: float) -> None:
        self.stats.calls += 1
        self.stats.overhead_s.append(time.perf_counter() - t0 - gen_s)


def _strip_stop(text: str, stops: tuple[str, ...]) -> str:
    """OpenAI leaves the stop string out of the content (the sampled tokens keep it)."""
    cut = [text.rfind(s) for s in stops if s in text]
    return text[: max(cut)] if cut else text


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"
