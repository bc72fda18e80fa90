"""A workflow as a graph (issue #50, item 6): parents on the left, the jobs
that wait for them to their right, one column per level, each job a box
coloured by its state and linked to its page. A child a step spawned at run
time (job.spawn, issue #52) sits right of its parent, on a dashed edge.
Inline SVG, laid out here (no script: the dashboard's CSP forbids them, and
needs none)."""

from __future__ import annotations

from html import escape
from typing import Any

BOX_W, BOX_H, GAP_X, GAP_Y = 170, 36, 60, 14
MAX_NODES = 400  # larger workflows get the table only
COLOUR = {"queued": "#e3e6ea", "active": "#cfe0ff", "completed": "#cdebd6",
          "failed": "#f5c6c6", "cancelled": "#f1f1f1"}


def _parents(step: Any) -> list[Any]:
    """What it waits for, and the job that spawned it (schema 0038)."""
    spawner = step.get("spawned_by")
    return [p for p in step["after"] if p is not None] + ([spawner] if spawner else [])


def levels(steps: list[Any]) -> dict[Any, int]:
    """Each step's level: 0 with no parent in the workflow, else one more
    than its deepest parent's (the longest path from a root)."""
    parents = {s["id"]: _parents(s) for s in steps}
    level: dict[Any, int] = {}

    def of(node: Any, seen: frozenset[Any] = frozenset()) -> int:
        if node not in level:
            inside = [p for p in parents.get(node, []) if p in parents and p not in seen]
            level[node] = 1 + max((of(p, seen | {node}) for p in inside), default=-1)
        return level[node]

    for s in steps:
        of(s["id"])
    return level


def svg(steps: list[Any]) -> str:
    """The graph, or "" when there is nothing to draw or too much."""
    if not steps or len(steps) > MAX_NODES:
        return ""
    level = levels(steps)
    rows: dict[int, int] = {}
    at: dict[Any, tuple[int, int]] = {}
    for s in sorted(steps, key=lambda s: (level[s["id"]], s["created_at"], s["id"])):
        n = level[s["id"]]
        at[s["id"]] = (n * (BOX_W + GAP_X) + 4, rows.get(n, 0) * (BOX_H + GAP_Y) + 4)
        rows[n] = rows.get(n, 0) + 1
    width = (max(rows) + 1) * (BOX_W + GAP_X)
    height = max(rows.values()) * (BOX_H + GAP_Y) + 8
    edges = []
    for s in steps:
        cx, cy = at[s["id"]]
        for p in _parents(s):
            if p in at:
                px, py = at[p]
                spawn = p == s.get("spawned_by")
                edges.append(f'<line x1="{px + BOX_W}" y1="{py + BOX_H / 2}" x2="{cx}" '
                             f'y2="{cy + BOX_H / 2}" stroke="#8a94a6" stroke-width="1.2"'
                             + (' stroke-dasharray="5 3" class="spawned"' if spawn else '')
                             + '/>')
    nodes = []
    for s in steps:
        x, y = at[s["id"]]
        fill = COLOUR.get(s["status"], "#fff")
        nodes.append(
            f'<a href="/job/{s["id"]}" class="node {escape(s["status"])}" data-job="{s["id"]}">'
            f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="5" fill="{fill}" '
            f'stroke="#5b6475"/><text x="{x + 8}" y="{y + 15}" font-size="12">'
            f'{str(s["id"])[:8]} · {escape(s["status"])}</text>'
            f'<text x="{x + 8}" y="{y + 29}" font-size="11" fill="#5b6475">'
            f'{escape(str(s["queue"])[:24])}</text></a>')
    return (f'<svg id="graph" width="{width}" height="{height}" role="img" '
            f'aria-label="the workflow: each job after the jobs it waits for and '
            f'the job that spawned it">'
            f'{"".join(edges)}{"".join(nodes)}</svg>')
