"""Chat templates: which one renders a conversation (the model's own, the shipped Hermes
ChatML one when the model's cannot render tools, a file or jinja source), whether it renders
tools, and the tokenizer's special tokens the renderer needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl._suggest import suggest
from agentrl.errors import ConfigError

TEMPLATES_DIR = Path(__file__).parent.parent / "templates"
BUILTIN_TEMPLATES = {"hermes_chatml": "hermes_chatml.jinja"}

_PROBE_TOOL_NAME = "agentrl_probe_tool"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": _PROBE_TOOL_NAME,
        "description": "probe",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
    },
}
SENTINEL = "AGENTRL_SENTINEL_7f3a"  # content that marks where an assistant turn ends
END_OF_TEXT = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>")


def load_template(template: str) -> tuple[str, str]:
    """Resolve ``template`` (built-in name, ``.jinja`` path or jinja source) to (name, source)."""
    if template in BUILTIN_TEMPLATES:
        return template, (TEMPLATES_DIR / BUILTIN_TEMPLATES[template]).read_text()
    if "{{" in template or "{%" in template:
        return "custom", template
    path = Path(template).expanduser()
    if path.is_file():
        return str(path), path.read_text()
    raise ConfigError(
        f"chat template {template!r} is neither a built-in template "
        f"({', '.join(BUILTIN_TEMPLATES)}), 'model', an existing .jinja file nor jinja source"
        f"{suggest(template, [*BUILTIN_TEMPLATES, 'model'])}"
    )


def template_supports_tools(tokenizer: Any, chat_template: str | None = None) -> bool:
    """True when the template renders the tool list it is given (probed with a dummy tool)."""
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        return False
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    try:
        text = tokenizer.apply_chat_template(
            msgs, tools=[_PROBE_TOOL], chat_template=chat_template, tokenize=False
        )
    except Exception:  # a template that chokes on tools cannot render them
        return False
    return _PROBE_TOOL_NAME in text


def resolve_template(tokenizer: Any, template: str | None, tools: bool) -> tuple[str, str]:
    """(name, source) of the template a renderer uses (see :class:`ChatRenderer`)."""
    own = getattr(tokenizer, "chat_template", None)
    if template == "model" or (template is None and own and not tools):
        if not own:
            raise ConfigError(
                "model.chat_template='model' but the tokenizer has no chat template: "
                "use 'hermes_chatml' or a path to a .jinja file"
            )
        return "model", own
    if template is None:
        if own and template_supports_tools(tokenizer):
            return "model", own
        return load_template("hermes_chatml")
    return load_template(template)


def special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for idx, tok in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(idx))
    return ids
