"""The layout of an ARPO branch tree: one row per trajectory, a child drawn from its
parent's row at the token where it forked, with the entropy change that made it fork."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROW = 34  # pixels per trajectory
LEFT = 12
WIDTH = 560  # pixels for the longest trajectory's tokens
PROMPT = 48  # pixels for the prompt every path shares: the branches get the rest of the width


@dataclass
class Node:
    traj_id: str
    index: int
    row: int
    x0: float  # where its own tokens start (the fork point; LEFT for a root)
    x1: float  # where it ends
    y: float
    parent_row: int | None
    fork_turn: int | None  # the parent's turn after whose tool result it forked
    delta_h: float | None  # normalised entropy change at the fork
    reward: float
    advantage: float | None
    status: str
    leaf: bool


def fork_turn(parent: dict[str, Any], position: int) -> int:
    """The parent's turns generated before token `position` (the fork follows that turn's
    tool result)."""
    seen, turns = 0, 0
    for seg in parent.get("segments", []):
        if seen >= position:
            break
        if seg.get("kind") == "model":
            turns += 1
        seen += len(seg.get("token_ids", []))
    return max(turns, 1)


def _prompt_tokens(traj: dict[str, Any]) -> int:
    segs = traj.get("segments") or []
    first = segs[0] if segs else {}
    return len(first.get("token_ids", [])) if first.get("kind") == "prompt" else 0


def layout(group: dict[str, Any], advantages: dict[str, float | None]) -> tuple[list[Node], int]:
    """Nodes in depth-first order (children under their parent) and the drawing's height."""
    trajs = group.get("trajectories", [])
    by_id = {t.get("traj_id"): (i, t) for i, t in enumerate(trajs)}
    children: dict[str | None, list[str]] = {}
    for t in trajs:
        parent = t.get("parent_id") if t.get("parent_id") in by_id else None
        children.setdefault(parent, []).append(t.get("traj_id"))
    longest = max(
        (sum(len(s.get("token_ids", [])) for s in t.get("segments", [])) for t in trajs), default=1
    )
    # the shared prompt drawn as a short stub: a long prompt would squash the branches
    prompt = min(_prompt_tokens(t) for t in trajs) if trajs else 0
    scale = (WIDTH - PROMPT) / max(longest - prompt, 1)

    def x(position: int) -> float:
        if position <= prompt:
            return LEFT + PROMPT * position / max(prompt, 1)
        return LEFT + PROMPT + (position - prompt) * scale

    deltas: dict[str, float] = {}
    for t in trajs:
        for point in t.get("metadata", {}).get("branch_points", []) or []:
            for child in point.get("children", []):
                deltas[child] = point.get("delta_h")
    nodes: list[Node] = []
    rows: dict[str, int] = {}

    def visit(tid: str) -> None:
        i, t = by_id[tid]
        pid = t.get("parent_id") if t.get("parent_id") in by_id else None
        n_tok = sum(len(s.get("token_ids", [])) for s in t.get("segments", []))
        pos = t.get("branch_position") if pid is not None else None
        row = len(nodes)
        rows[tid] = row
        nodes.append(
            Node(
                traj_id=tid,
                index=i,
                row=row,
                x0=x(pos or 0),
                x1=x(n_tok),
                y=ROW * row + ROW / 2,
                parent_row=rows.get(pid) if pid is not None else None,
                fork_turn=fork_turn(by_id[pid][1], pos or 0) if pid is not None else None,
                delta_h=deltas.get(tid),
                reward=float(t.get("reward", 0.0)),
                advantage=advantages.get(tid),
                status=str(t.get("status", "ok")),
                leaf=not children.get(tid),
            )
        )
        for c in children.get(tid, []):
            visit(c)

    for root in children.get(None, []):
        visit(root)
    return nodes, ROW * len(nodes) + 8
