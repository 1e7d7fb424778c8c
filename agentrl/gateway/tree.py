"""The session tree: how an episode's samples relate (issue 48, item 4).

A harness breaks its prefix on purpose: it compacts its context (a summarising call, then a
conversation that starts again from the summary), starts sub-agents (separate
conversations with their own system prompt), asks side questions (a title). Each such call
starts a new sample of the episode's group. When a sample starts, it is linked to one
recorded before it:

* ``continues`` -- it shares its first messages (at least the system prompt) with an
  earlier sample: a compaction, a truncation, an edited history. The parent is the sample
  sharing the most leading messages (then the most leading tokens).
* ``separate`` -- it shares no leading message: a new conversation. Its parent is the
  sample that was waiting on a tool call when it started (the caller: a sub-agent's
  ``Task`` call, a compaction between turns), the most recently active first; with none
  waiting it is a root of its own (an aside such as a title, made before the main loop).
* ``choice`` -- choice 2.. of an ``n > 1`` call: the parent is the sample it forked from.

The **main line** is the sample of the episode's last call and the samples it
``continues`` from, back to its root: the conversation that ended the episode.
``gateway.subagent_credit: main`` trains only the main line; ``all`` (the default) gives
every sample the episode's reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agentrl.runfolder import shared_with_parent, walk_session_tree

Relation = Literal["root", "continues", "separate", "choice"]
SubagentCredit = Literal["all", "main"]


@dataclass
class Link:
    """Where a sample came from (set when it is recorded; indices into the session's list)."""

    parent: int | None = None
    relation: Relation = "root"
    shared_messages: int = 0
    shared_tokens: int = 0


def _common(a: list[Any], b: list[Any]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def link(samples: list[Any], new: Any, forked_from: Any | None = None) -> Link:
    """The link of `new` (not yet in `samples`) to the samples recorded before it.

    `forked_from`: the sample an ``n > 1`` choice forked from."""
    if forked_from is not None and forked_from in samples:
        i = samples.index(forked_from)
        return Link(i, "choice", len(new.keys), _common(new.input_ids, forked_from.input_ids))
    best: tuple[int, int, int] | None = None  # (shared messages, shared tokens, index)
    ids = new.input_ids
    for i, old in enumerate(samples):
        if old.kind != new.kind:
            continue
        msgs = _common(new.keys, old.keys)
        toks = _common(ids, old.input_ids)
        shares = msgs > 0 if new.kind == "chat" else toks > 0
        if shares and (best is None or (msgs, toks) > best[:2]):
            best = (msgs, toks, i)
    if best is not None:
        return Link(best[2], "continues", best[0], best[1])
    waiting = [i for i, old in enumerate(samples) if old.turns and old.turns[-1].tool_calls]
    if waiting:
        caller = max(waiting, key=lambda i: samples[i].last_call)
        return Link(caller, "separate", 0, _common(ids, samples[caller].input_ids))
    return Link(None, "root")


def main_line(links: list[Link], last: int | None) -> set[int]:
    """The last call's sample and the samples it continues, back to its root."""
    line: set[int] = set()
    i = last
    while i is not None and i not in line:
        line.add(i)
        node = links[i]
        i = node.parent if node.relation == "continues" else None
    return line


def tree_rows(samples: list[Any], keep: list[int], line: set[int]) -> list[dict[str, Any]]:
    """One row per recorded sample (trajectory numbers: positions in `keep`)."""
    number = {i: k for k, i in enumerate(keep)}
    rows = []
    for i in keep:
        s, node = samples[i], samples[i].link
        rows.append(
            {
                "sample": number[i],
                "parent": number.get(node.parent) if node.parent is not None else None,
                "relation": node.relation,
                "shared_messages": node.shared_messages,
                "shared_tokens": node.shared_tokens,
                "calls": len(s.turns),
                "model_tokens": sum(len(g) for g in s.segments if g.kind == "model"),
                "main": i in line,
                "started_by": s.reason,
            }
        )
    return rows


def format_tree(rows: list[dict[str, Any]], credit: str = "all") -> list[str]:
    """The tree as indented lines, children under their parent (for `agentrl inspect`)."""
    lines: list[str] = []
    for row, depth in walk_session_tree(rows):
        mark = "main" if row["main"] else ("not trained" if credit == "main" else "")
        rel = row["relation"]
        if shared := shared_with_parent(row):
            rel += f" ({shared})"
        text = f"{'  ' * depth}sample {row['sample'] + 1}: {rel}, {row['calls']} calls"
        text += f", {row['model_tokens']} model tokens" + (f" [{mark}]" if mark else "")
        lines.append(text)
    return lines
