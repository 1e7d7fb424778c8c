"""Supervised warm-start on chat transcripts, rendered exactly as RL renders episodes.

    agentrl sft demos.jsonl --model smollm2-135m-instruct --config configs/demo.yaml --out sft/

A JSONL row is ``{"messages": [...], "tools": [...]?}``: system / user turns, assistant turns
(text, or OpenAI ``tool_calls`` written as Hermes ``<tool_call>`` blocks) and ``tool``
results. Each transcript is built the way an RL episode is (:class:`agentrl.chat.ChatTranscript`):
the prompt up to the first assistant turn, every assistant turn as a model segment (its
tokens plus the end-of-turn token a sampler would stop at), every tool result or user turn
in between as an observation delta, and the runtime prefix check at the end. So the tokens
trained here are the tokens RL samples and trains, and the loss mask is 1 exactly on the
assistant's tokens (tool calls included, tool results and prompts not). The chat template
and tools are the RL run's when ``--config`` names it.

It trains on the trainer core (:mod:`agentrl.learner.core`) and reads the sections RL reads:
``model.*`` (name, LoRA, chat template), ``learner.*`` (lr, betas, weight decay, clipping,
schedule, micro-batch size, device, precision, compile), resolved by the run layer
(:func:`agentrl.run.settings.sft_settings`) with the CLI flags as overrides; ``lr`` is SFT's
own 1e-5 unless the config or a flag sets ``learner.lr``.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.chat import ChatRenderer, ChatTranscript
from agentrl.envs import make_env
from agentrl.envs.dataset import read_jsonl
from agentrl.errors import DatasetError, TemplateMismatchError
from agentrl.model_folder import write_model_folder
from agentrl.models import load_model
from agentrl.training.settings import SFTSettings, ToolSource

Message = dict[str, Any]


@dataclass
class Example:
    input_ids: list[int]
    loss_mask: list[int]
    where: str


def assistant_text(message: Message, where: str) -> str:
    """The text the model writes for an assistant message: its content, or its OpenAI
    ``tool_calls`` as Hermes blocks (the format the Hermes template renders and parses)."""
    content = message.get("content")
    if content:
        return str(content)
    calls = message.get("tool_calls") or []
    if not calls:
        raise DatasetError(f"{where}: an assistant message with neither content nor tool_calls")
    blocks = []
    for call in calls:
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        blocks.append(
            f'<tool_call>\n{{"name": {json.dumps(fn["name"])}, "arguments": {args_text}}}\n'
            "</tool_call>"
        )
    return "\n".join(blocks)


def encode_transcript(renderer: Any, messages: Sequence[Message], where: str = "") -> Example:
    """Token ids and assistant-only loss mask of a conversation, built token in, token out
    as a rollout builds an episode, and checked against a full render."""
    roles = [m.get("role") for m in messages]
    if "assistant" not in roles:
        raise DatasetError(f"{where}: no assistant message to learn from")
    first = roles.index("assistant")
    if first == 0:
        raise DatasetError(f"{where}: the conversation starts with an assistant message")
    chat = ChatTranscript(renderer, [dict(m) for m in messages[:first]])
    i = first
    while i < len(messages):
        text = assistant_text(messages[i], f"{where} (message {i})")
        ids = renderer.encode(text) + list(renderer.end_of_turn_ids)
        if chat.add_model(ids) != text:
            raise DatasetError(
                f"{where} (message {i}): the assistant text does not survive tokenization "
                "(it decodes differently); remove special tokens or stray characters from it"
            )
        j = i + 1
        while j < len(messages) and messages[j].get("role") != "assistant":
            j += 1
        if j == i + 1 and j < len(messages):
            raise DatasetError(
                f"{where} (message {j}): two assistant messages in a row; merge them or put "
                "the user/tool turn between them"
            )
        if j < len(messages):  # the turns between two assistant messages: an observation
            chat.add_observation([dict(m) for m in messages[i + 1 : j]])
        i = j
    try:
        chat.check(raise_on_mismatch=True)
    except TemplateMismatchError as e:
        raise DatasetError(f"{where}: {e}") from None
    return Example(chat.input_ids, chat.loss_mask, where)


def read_transcripts(path: str | Path) -> list[tuple[str, list[Message], list[Any] | None]]:
    """(where, messages, tools) of every JSONL row; a bad row names its line."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such transcript file")
    rows = []
    for where, row in read_jsonl(path):
        messages = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and "role" in m for m in messages
        ):
            raise DatasetError(f"{where}: expected {{'messages': [{{role, content}}, ...]}}")
        rows.append((where, messages, row.get("tools")))
    if not rows:
        raise DatasetError(f"{path}: no transcripts")
    return rows


@dataclass
class SFTReport:
    out: str
    examples: int
    eval_examples: int
    trained_tokens: int  # assistant tokens per epoch
    eval_loss_before: float
    eval_loss: float
    train_loss: float  # mean token loss of the last epoch
    seconds: float


def trained_positions(example: Example) -> int:
    """The tokens `example` is trained on (the first token is predicted from nothing)."""
    return int(sum(example.loss_mask[1:]))


def _batch_loss(model: Any, batch: Sequence[Example], pad_id: int, device: Any) -> Any:
    """Sum of token cross-entropies on the loss-masked (assistant) tokens."""
    import torch
    import torch.nn.functional as F

    from agentrl.learner.forward import decoder_hidden, lm_head_weight

    width = max(len(e.input_ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.bool)
    for row, e in enumerate(batch):
        n = len(e.input_ids)
        ids[row, :n] = torch.tensor(e.input_ids)
        mask[row, :n] = torch.tensor(e.loss_mask, dtype=torch.bool)
    ids, mask = ids.to(device), mask.to(device)
    # token t is predicted from the tokens before it; the LM head runs on the trained
    # positions only (prompts and tool results dominate agent transcripts); rows are
    # right-padded, so causal attention keeps real tokens from the padding
    predicts = mask[:, 1:]
    hidden = decoder_hidden(model, ids)[:, :-1][predicts]
    logits = (hidden @ lm_head_weight(model).t()).float()
    return F.cross_entropy(logits, ids[:, 1:][predicts], reduction="sum")


def _mean_loss(core: Any, examples: Sequence[Example], pad_id: int, bs: int) -> float:
    import torch

    if not examples:
        return math.nan
    total, count = 0.0, 0
    core.model.eval()
    with torch.inference_mode(), core.precision.autocast():
        for i in range(0, len(examples), bs):
            part = examples[i : i + bs]
            total += float(_batch_loss(core.model, part, pad_id, core.device))
            count += sum(trained_positions(e) for e in part)
    return total / max(count, 1)


def renderer_factory(
    tools: ToolSource | None, template: str | None, tokenizer: Any, rows_need_env: bool
) -> Callable[[list[Any] | None], ChatRenderer]:
    """A renderer per tool list: a row's own tools, else the config's environment's
    (`tools`, when the config names one); `template`: ``model.chat_template``."""
    env_tools = None
    if rows_need_env and tools is not None:
        env_tools = make_env(tools.name, **tools.options).tool_schemas()
    cache: dict[str, ChatRenderer] = {}

    def renderer_for(row_tools: list[Any] | None) -> ChatRenderer:
        row_tools = row_tools if row_tools is not None else env_tools
        key = json.dumps(row_tools, sort_keys=True)
        if key not in cache:
            cache[key] = ChatRenderer(tokenizer, tools=row_tools, template=template)
        return cache[key]

    return renderer_for


def train_sft(
    data: str | Path,
    out: str | Path,
    settings: SFTSettings | None = None,
    *,
    log: Callable[[str], None] = print,
) -> SFTReport:
    """Fine-tune on the transcripts of `data`; writes a model folder RL can start from
    (``model.name=OUT``) and returns the report. `settings`: resolved by the run layer
    (:func:`agentrl.run.settings.sft_settings`, the CLI flags applied)."""
    import torch

    from agentrl.learner.core import CoreSettings, TrainerCore
    from agentrl.learner.precision import Precision

    s = settings or SFTSettings()
    name, seed, batch_size, max_length = s.model.name, s.seed, s.batch_size, s.max_length
    t0 = time.time()
    rows = read_transcripts(data)
    precision = Precision.from_settings(s.train)
    torch.manual_seed(seed)
    model, tokenizer = load_model(
        name, dtype="float32", device=str(precision.device), seed=s.model.seed
    )
    renderer_for = renderer_factory(
        s.tools, s.chat_template, tokenizer, any(tools is None for _, _, tools in rows)
    )

    examples, skipped = [], 0
    for where, messages, tools in rows:
        example = encode_transcript(renderer_for(tools), messages, where)
        if len(example.input_ids) > max_length:
            skipped += 1
            continue
        examples.append(example)
    if skipped:
        log(f"skipped {skipped} transcripts longer than --max-length {max_length}")
    if not examples:
        raise DatasetError(f"{data}: every transcript is longer than --max-length {max_length}")
    random.Random(seed).shuffle(examples)
    n_eval = round(len(examples) * s.eval_fraction) if s.eval_fraction > 0 else 0
    held_out, train = examples[:n_eval], examples[n_eval:]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    steps = s.epochs * math.ceil(len(train) / batch_size)
    core = TrainerCore(
        model,
        CoreSettings.of(s.train, total_steps=steps),
        precision=precision,
        lora=s.model.lora,
    )
    core.compile_layers({"policy": core.model})
    before = _mean_loss(core, held_out, pad_id, batch_size)
    micro = max(1, s.train.micro_batch_size)
    rng = random.Random(seed + 1)
    train_loss = math.nan
    for epoch in range(s.epochs):
        core.model.train()
        order = list(train)
        rng.shuffle(order)
        total, count = 0.0, 0
        for i in range(0, len(order), batch_size):
            batch = order[i : i + batch_size]
            n = max(sum(trained_positions(e) for e in batch), 1)

            def loss_of(part: list[Example], counts: bool, n: int = n) -> Any:
                with core.precision.autocast():
                    return _batch_loss(core.model, part, pad_id, core.device) / n

            # the token mean over the batch's assistant tokens, micro-batch by micro-batch
            parts = [(batch[j : j + micro], True) for j in range(0, len(batch), micro)]
            done = core.update(parts, loss_of)
            core.end_step()
            total, count = total + float(done.loss) * n, count + n
        train_loss = total / max(count, 1)
        log(f"epoch {epoch + 1}/{s.epochs}: assistant-token loss {train_loss:.4f}")
    core.model.eval()
    after = _mean_loss(core, held_out, pad_id, batch_size)
    report = SFTReport(
        out=str(out),
        examples=len(train),
        eval_examples=len(held_out),
        trained_tokens=sum(sum(e.loss_mask) for e in train),
        eval_loss_before=before,
        eval_loss=after,
        train_loss=train_loss,
        seconds=time.time() - t0,
    )
    write_model_folder(
        core.plain_model(lambda: load_model(name, dtype="float32", seed=s.model.seed)[0]),
        renderer_for(None),
        out,
        record={"base_model": name, "sft_data": str(data), "sft": report.__dict__},
    )
    return report
