"""search_qa: questions about countries that need a search tool to answer.

The corpus is one document per country from the ``countryinfo`` package (see
:mod:`agentrl.envs.countries`), indexed once per process with the local tantivy index.
Questions are single-hop ("What is the capital of Chad?") or multi-hop ("What is the ISO
currency code used in the country whose capital is Ouagadougou?"); the reward is exact
match after normalisation (case, punctuation, articles, accents), with token F1 in info.

    env = make_env("search_qa", multi_hop_fraction=0.5, top_k=3)
    env = make_env("search_qa", search_delay_s=0.2)  # stand-in for a remote service
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import Field, field_validator

from agentrl._suggest import suggest
from agentrl.envs.base import EnvOptions, ToolEnvironment
from agentrl.envs.countries import KINDS, documents, generate_questions
from agentrl.envs.verifiers import ExactMatchVerifier, Verifier
from agentrl.tools import LocalSearchIndex, SearchTool

EVAL_SEED_OFFSET = 1_000_003
SNIPPET_CHARS = 600

SYSTEM_PROMPT = """\
You answer questions about countries. You do not know the facts: look them up with the
search tool, one search per call:
<tool_call>
{"name": "search", "arguments": {"query": "..."}}
</tool_call>
The results come back in <tool_response>. When you know the answer, reply with only the
answer in \\boxed{}.

Example
user: What is the capital of the country that borders both Guinea and Sierra Leone?
assistant: <tool_call>
{"name": "search", "arguments": {"query": "borders Guinea Sierra Leone"}}
</tool_call>
tool: <tool_response>
[1] Liberia
Liberia is a country in Western Africa, Africa. The capital of Liberia is Monrovia. ...
</tool_response>
assistant: \\boxed{Monrovia}"""


class SearchQAOptions(EnvOptions):
    kinds: list[str] = Field(default_factory=lambda: list(KINDS))
    multi_hop_fraction: float = Field(0.5, ge=0.0, le=1.0)
    size: int = Field(1000, ge=1, description="questions per split")
    top_k: int = Field(3, ge=1, le=20)
    search_delay_s: float = Field(0.0, ge=0.0, description="added latency per search call")
    search_timeout_s: float = Field(10.0, gt=0)
    system_prompt: str | None = None

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, kinds: list[str]) -> list[str]:
        if not kinds:
            raise ValueError(f"give at least one question kind: {', '.join(KINDS)}")
        for k in kinds:
            if k not in KINDS:
                raise ValueError(
                    f"unknown question kind {k!r}{suggest(k, KINDS)}; kinds: {', '.join(KINDS)}"
                )
        return kinds


class SearchQAEnv(ToolEnvironment):
    """Single- and multi-hop questions about countries, answered with a search tool."""

    name = "search_qa"
    Options = SearchQAOptions
    tool_types: ClassVar = (SearchTool,)

    _index: ClassVar[Any] = None  # built once per process, shared by every episode
    _index_lock: ClassVar[threading.Lock] = threading.Lock()

    config: SearchQAOptions

    @classmethod
    def index(cls) -> Any:
        """The process-wide index over the country documents."""
        with cls._index_lock:
            if cls._index is None:
                # snippets long enough to hold a whole country record
                cls._index = LocalSearchIndex.from_documents(
                    documents(), snippet_chars=SNIPPET_CHARS
                )
            return cls._index

    def make_tools(self) -> list[Any]:
        return [
            SearchTool(
                self.index(),
                k=self.config.top_k,
                timeout=self.config.search_timeout_s,
                delay_s=self.config.search_delay_s,
            )
        ]

    def make_verifier(self) -> Verifier:
        return ExactMatchVerifier()

    def system_prompt(self) -> str:
        return self.config.system_prompt or SYSTEM_PROMPT

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        base_seed = seed + (EVAL_SEED_OFFSET if split != "train" else 0)
        yield from generate_questions(
            self.config.kinds, self.config.size, base_seed, self.config.multi_hop_fraction
        )
