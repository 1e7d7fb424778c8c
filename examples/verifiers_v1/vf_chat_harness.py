"""A verifiers v1 harness that runs its chat loop in-process (the v1 contract allows it:
every model call goes through the interception ``endpoint`` with its ``secret``). The
built-in ``null`` / ``bash`` harnesses do the same from a uv script, which needs ``uv`` and
network access on first use; this one needs neither. Plain verifiers code, no agentrl."""

from __future__ import annotations

import openai
import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire


class ChatHarnessConfig(vf.HarnessConfig):
    pass


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    """One model call per segment: the system prompt, the conversation so far, a reply."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True  # a later user turn relaunches it on the whole conversation
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kwargs):
        system, prompt = self.resolve_prompt(data)
        messages: list[dict] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [message_to_wire(m) for m in prompt or []]
        client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            await client.chat.completions.create(model=ctx.model, messages=messages)
        finally:
            await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["ChatHarness", "ChatHarnessConfig"]
