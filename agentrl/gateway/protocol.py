"""The OpenAI wire format the gateway speaks: pydantic request models and errors.

Requests are validated here; every parameter is either honoured by the gateway or
rejected with an OpenAI-shaped error (``{"error": {"message", "type", "param", "code"}}``
and the matching HTTP status), never silently dropped. Parameters that only label a
request (``user``, ``metadata``, ``store``) are accepted and have no effect on sampling.
Responses are plain dicts built by the server (they are written once, never read back).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ErrorType = Literal[
    "invalid_request_error", "authentication_error", "not_found_error", "server_error"
]


class OpenAIError(Exception):
    """An error the gateway answers with, shaped like OpenAI's."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: ErrorType = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def unsupported(param: str, why: str) -> OpenAIError:
    return OpenAIError(400, f"{param}: {why}", param=param, code="unsupported_parameter")


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """A request's ``stop`` as a tuple, as OpenAI allows it: up to 4 non-empty strings."""
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > 4 or any(not s for s in stops):
        raise bad_request("stop takes up to 4 non-empty strings", "stop")
    return stops


def from_validation(err: ValidationError) -> OpenAIError:
    """The first problem of a pydantic error as a 400 naming the parameter."""
    first = err.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    if first["type"] == "missing":
        message = f"Missing required parameter: '{param}'."
        return OpenAIError(400, message, param=param, code="missing_required_parameter")
    if first["type"] == "extra_forbidden":
        return unsupported(str(param), "unknown parameter (the gateway does not implement it)")
    got = first.get("input")
    shown = repr(got) if not isinstance(got, dict | list) else type(got).__name__
    message = f"Invalid value for '{param}': {first['msg']} (got {shown})."
    return OpenAIError(400, message, param=param, code="invalid_value")


# --- chat completions ---------------------------------------------------------------------


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionCall(_Wire):
    name: str
    arguments: str = ""


class ToolCallIn(_Wire):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    # clients add fields of their own (refusal, annotations, audio=None): kept, not rendered
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message's text; non-text parts (images, audio) are rejected."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise unsupported(
                    "messages.content", f"content part type {part.type!r} (only text parts)"
                )
            parts.append(part.text)
        return "".join(parts)


_FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class FunctionDef(_Wire):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _FUNCTION_NAME.match(v):
            raise ValueError("a function name is 1-64 letters, digits, '_' or '-'")
        return v

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type", "object") != "object":
            raise ValueError("function parameters must be a JSON schema of type 'object'")
        return v


class ToolDef(_Wire):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Wire):
    include_usage: bool = False


class ChatCompletionRequest(_Wire):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)  # vLLM's extension
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    # labels only: accepted, no effect on sampling
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None

    def check_supported(self) -> None:
        """Reject what the gateway cannot honour (400, naming the parameter and why)."""
        if self.top_logprobs:
            raise unsupported("top_logprobs", "only the sampled tokens' log-probs are recorded")
        if self.frequency_penalty or self.presence_penalty:
            param = "frequency_penalty" if self.frequency_penalty else "presence_penalty"
            raise unsupported(param, "penalties would change the behaviour log-probs")
        if self.logit_bias:
            raise unsupported("logit_bias", "logit biases would change the behaviour log-probs")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise unsupported("response_format", "only {'type': 'text'} (no guided decoding)")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed with stream=true", "stream_options")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return stop_strings(self.stop)

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


# --- completions ---------------------------------------------------------------------------


class CompletionRequest(_Wire):
    model: str
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1)
    seed: int | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def check_supported(self) -> None:
        if self.echo:
            raise unsupported("echo", "the prompt is not sampled; its tokens have no log-probs")
        if self.suffix:
            raise unsupported("suffix", "insertion needs a fill-in-the-middle template")
        if self.best_of not in (None, 1):
            raise unsupported("best_of", "pick among n samples on the client instead")
        if self.logprobs:
            raise unsupported("logprobs", "only logprobs=0 (the sampled tokens' log-probs)")
        if self.frequency_penalty or self.presence_penalty or self.logit_bias:
            raise unsupported("logit_bias", "penalties and biases would change log-probs")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return stop_strings(self.stop)

    def single_prompt(self) -> str | list[int]:
        """The one prompt of this request (batched prompts are rejected)."""
        p = self.prompt
        if isinstance(p, str):
            return p
        if p and all(isinstance(x, int) for x in p):
            return list(p)  # type: ignore[arg-type]
        if len(p) == 1:
            return p[0]  # type: ignore[return-value]
        raise unsupported("prompt", "one prompt per request (send one request per prompt)")
