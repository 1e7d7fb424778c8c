"""The session tree of an agent episode on its trajectory page: which sample a sub-agent or
a compaction came from, and which samples got the episode's reward.

The gateway writes the tree into every sample's ``metadata.gateway.tree`` (one row per
recorded sample: ``sample``, ``parent``, ``relation``, ``main`` ...; see
:mod:`agentrl.gateway.tree`). A sample that was trained is a trajectory of the same group:
the episode's first kept one has the episode's id, the others ``<id>.s<k>``; under
``gateway.subagent_credit: main`` the samples off the main line are in the tree only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agentrl.runfolder import shared_with_parent, walk_session_tree

RELATIONS = {
    "root": "a new conversation",
    "continues": "goes on from its parent's leading messages (a compaction, an edited history)",
    "separate": "a separate conversation started while its parent waited on a tool call "
    "(a sub-agent, a summary)",
    "choice": "another choice of its parent's n > 1 call",
}


@dataclass
class SessionNode:
    sample: int  # 1-based, as `agentrl inspect` numbers them
    depth: int
    relation: str
    detail: str  # what is shared with the parent, for `continues`
    calls: int
    model_tokens: int
    main: bool
    credited: bool  # got the episode's reward and trained (gateway.subagent_credit)
    traj_id: str | None  # its trajectory in the group, when it was kept
    current: bool  # the sample of the page
    started_by: str


def _episode_id(traj: dict[str, Any]) -> str:
    """The episode's id: a trajectory's id without its ``.s<k>`` sample suffix."""
    k = traj.get("metadata", {}).get("gateway", {}).get("sample")
    tid = str(traj.get("traj_id", ""))
    return re.sub(rf"\.s{k}$", "", tid) if isinstance(k, int) else tid


def session_tree(traj: dict[str, Any], group: dict[str, Any]) -> tuple[list[SessionNode], str]:
    """The tree of `traj`'s episode, depth first (children under their parent), and the
    credit setting; empty when the episode had a single sample or is no gateway episode."""
    gateway = traj.get("metadata", {}).get("gateway") or {}
    rows = gateway.get("tree") or []
    if len(rows) < 2:
        return [], ""
    credit = str(gateway.get("credit", "all"))
    episode = _episode_id(traj)
    kept: dict[int, str] = {}  # sample -> trajectory id, for this episode's trajectories
    for other in group.get("trajectories", []):
        g = other.get("metadata", {}).get("gateway") or {}
        if g.get("tree") == rows and _episode_id(other) == episode:
            kept[int(g["sample"])] = str(other["traj_id"])
    nodes = [
        SessionNode(
            sample=int(row["sample"]) + 1,
            depth=depth,
            relation=str(row.get("relation", "")),
            detail=shared_with_parent(row),
            calls=int(row.get("calls", 0)),
            model_tokens=int(row.get("model_tokens", 0)),
            main=bool(row.get("main")),
            credited=credit == "all" or bool(row.get("main")),
            traj_id=kept.get(int(row["sample"])),
            current=int(row["sample"]) == gateway.get("sample"),
            started_by=str(row.get("started_by") or ""),
        )
        for row, depth in walk_session_tree(rows)
    ]
    return nodes, credit
