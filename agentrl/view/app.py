"""The viewer's web app: server-rendered pages over a :class:`~agentrl.view.data.Catalog`.

Every page takes its state from the URL (run, step, filters, colour, page), so a view can
be shared by copying its address. Each request first reads what the run files gained since
the last one; nothing here writes to a run folder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, PackageLoader, select_autoescape

from agentrl.view.catalog import Catalog, Indexer
from agentrl.view.data import SORTS, Filters, Run
from agentrl.view.outcomes import call_error_text, call_outcome
from agentrl.view.series import config_diff, eval_table, metric_payload
from agentrl.view.session import RELATIONS, session_tree
from agentrl.view.tokens import QUANTITIES, tokens_of, warm_up
from agentrl.view.tree import WIDTH, layout

SAME_TASK_SHOWN = 12  # groups of the same task listed on a group page
PAGE_SIZE = 50  # groups per page of the group list (more load as the page scrolls)
REWARD_SCALE = ("#eef0f4", "#1f8a4c")  # a sample's reward 0 -> 1 in the groups' strips
FIRST_READ_BYTES = 8 << 20  # of trace read before serving; the rest is read on a thread
REQUEST_READ_BYTES = 1 << 20  # of trace a request reads before answering

# the run page's first chart: what a user asks first, each curve labelled by what it is over
HEADLINE = [
    ["trace/reward_mean", "rollout reward (all finished groups)"],
    ["reward/mean", "trained-batch reward (reward/mean)"],
    [["eval/mean_reward", "eval/reward_mean"], "held-out eval reward"],
]
# titles of the numbers the view recomputes from the trace (other charts are titled by key)
LABELS = {
    "trace/reward_mean": "rollout reward, all finished groups (trace/reward_mean)",
    "trace/tool_success_rate": "tool-call success rate (trace/tool_success_rate)",
    "trace/tool_failures": "failed tool calls (trace/tool_failures)",
    "trace/truncated": "share of samples truncated or cut at the token limit (trace/truncated)",
    "trace/groups": "groups finished (trace/groups)",
}
# the charts shown below it until the picker (or ?m=) chooses others
DEFAULT_CHARTS = [
    "trace/tool_success_rate",
    "dist:reward",
    "dist:length",
    "grad_norm",
    "entropy",
    "is_ratio/max",
    "trace/truncated",
    "staleness/mean",
]


def _reward_color(t: Any) -> str:
    """A sample's square in a group's strip: reward 0 (light grey) to 1 (green), clipped;
    a negative reward red; an infra error dark red."""
    if t.status == "infra_error":
        return "#922b21"
    r = t.reward
    if r < 0:
        return f"hsl(5 75% {round(92 - 40 * min(-r, 1.0))}%)"
    x = min(r, 1.0)
    return f"hsl(145 {round(10 + 53 * x)}% {round(94 - 61 * x)}%)"


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.{digits}f}" if abs(v) < 1e4 else f"{v:.3g}"
    return str(v)


def _config(run: Run) -> dict[str, Any]:
    try:
        cfg = yaml.safe_load(run.config_text) or {}
    except yaml.YAMLError:
        return {}
    return cfg if isinstance(cfg, dict) else {}


def _model_name(run: Run) -> str | None:
    name = (_config(run).get("model") or {}).get("name")
    return str(name) if name else None


def _int(v: str | None, name: str) -> int | None:
    return _parse(v, name, int, "an integer")


def _float(v: str | None, name: str) -> float | None:
    return _parse(v, name, float, "a number")


def _parse(v: str | None, name: str, kind: Callable[[str], Any], what: str) -> Any:
    """A query parameter as `kind` (None when absent); a 400 naming it when malformed."""
    if v is None or v == "":
        return None
    try:
        return kind(v)
    except ValueError:
        raise HTTPException(400, f"{name} must be {what} (got {v!r})") from None


def create_app(root: Path, follow: bool = False, pending_run: bool = False) -> FastAPI:
    """The app over the run (or folder of runs) at `root` (`pending_run`: a run that is
    about to write its first files there)."""
    catalog = Catalog(root, pending_run=pending_run)
    catalog.refresh(FIRST_READ_BYTES)  # a small run is whole from the first page on
    indexer = Indexer(catalog).start()
    env = Environment(
        loader=PackageLoader("agentrl.view", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["fmt"] = _fmt
    env.filters["reward_color"] = _reward_color
    env.globals.update(
        follow=follow,
        quantities=QUANTITIES,
        tree_width=WIDTH,
        labels=LABELS,
        reward_scale=REWARD_SCALE,
    )
    app = FastAPI(title="agentrl view", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=str(files("agentrl.view") / "static")), "static")
    app.state.catalog = catalog
    app.state.indexer = indexer
    for run in list(catalog.runs.values())[:1]:
        warm_up(_model_name(run))

    def render(name: str, **ctx: Any) -> HTMLResponse:
        run = ctx.get("run")
        if run is None:
            return HTMLResponse(env.get_template(name).render(catalog=catalog, **ctx))
        with run.lock:  # the indexer thread appends to what the template iterates
            return HTMLResponse(env.get_template(name).render(catalog=catalog, **ctx))

    def get_run(name: str | None) -> Run:
        # the indexer thread reads on its own; a request also reads what arrived since, so a
        # page is never older than the files (the thread can starve beside a training)
        catalog.refresh(REQUEST_READ_BYTES)
        if not name:
            if len(catalog.runs) == 1:
                return next(iter(catalog.runs.values()))
            raise HTTPException(400, "run is missing: add ?run=NAME (see the list of runs at /)")
        try:
            return catalog.get(name)
        except KeyError:
            raise HTTPException(
                404, f"no run {name!r} here (runs: {', '.join(catalog.runs)})"
            ) from None

    @app.exception_handler(HTTPException)
    async def _error(request: Request, exc: HTTPException) -> HTMLResponse:
        return HTMLResponse(
            env.get_template("error.html").render(catalog=catalog, message=exc.detail),
            status_code=exc.status_code,
        )

    @app.get("/", response_class=HTMLResponse)
    def runs_page(request: Request) -> HTMLResponse:
        catalog.refresh(REQUEST_READ_BYTES)
        if len(catalog.runs) == 1:
            run = next(iter(catalog.runs.values()))
            return run_page(request, run.name)
        chosen = request.query_params.getlist("sel") or list(catalog.runs)
        return render("runs.html", chosen=chosen, headline=HEADLINE, defaults=DEFAULT_CHARTS)

    @app.get("/run", response_class=HTMLResponse)
    def run_page(request: Request, run: str | None = None) -> HTMLResponse:
        r = get_run(run)
        others = [get_run(name) for name in request.query_params.getlist("with") if name != r.name]
        return render(
            "run.html",
            run=r,
            headline=HEADLINE,
            defaults=DEFAULT_CHARTS,
            summary=r.summary(),
            overlay=[r.name] + [o.name for o in others],
            diffs=[(o.name, config_diff(_config(r), _config(o))) for o in others],
        )

    @app.get("/fragment/summary", response_class=HTMLResponse)
    def summary_fragment(run: str | None = None) -> HTMLResponse:
        r = get_run(run)
        return render("_summary.html", run=r, summary=r.summary(), fragment=True)

    @app.get("/fragment/steps", response_class=HTMLResponse)
    def steps_fragment(run: str | None = None) -> HTMLResponse:
        r = get_run(run)
        return render("_steps.html", run=r)

    @app.get("/api/metrics")
    def metrics(request: Request) -> JSONResponse:
        names = request.query_params.getlist("run") or list(catalog.runs)
        out = {}
        for name in names:
            r = get_run(name)
            out[r.name] = metric_payload(r)
        return JSONResponse(out)

    @app.get("/api/state")
    def state(run: str | None = None) -> JSONResponse:
        r = get_run(run)
        return JSONResponse(
            {"version": r.version, "live": r.live, "steps": len(r.steps), "groups": len(r.groups)}
        )

    def filters_from(request: Request) -> Filters:
        q = request.query_params
        status = q.get("status", "")
        if status not in ("", "ok", "truncated", "infra_error"):
            raise HTTPException(
                400, f"status must be ok, truncated or infra_error (got {status!r})"
            )
        sort = q.get("sort", "")
        if sort.lstrip("-") not in ("", *SORTS):
            choices = ", ".join(f"{k}, -{k}" for k in SORTS)
            raise HTTPException(400, f"sort must be one of {choices} (got {sort!r})")
        return Filters(
            step=_int(q.get("step"), "step"),
            status=status,
            reward_min=_float(q.get("rmin"), "rmin"),
            reward_max=_float(q.get("rmax"), "rmax"),
            parse_error=q.get("parse") == "1",
            no_tool_call=q.get("notool") == "1",
            tool=q.get("tool", ""),
            q=q.get("q", ""),
            task=q.get("task", ""),
            tool_error=q.get("toolerr") == "1",
            mixed=q.get("mixed") == "1",
            dropped=q.get("dropped") == "1",
            truncated=q.get("truncated") == "1",
            sort=sort,
        )

    @app.get("/groups", response_class=HTMLResponse)
    def groups_page(request: Request, run: str | None = None) -> HTMLResponse:
        r = get_run(run)
        f = filters_from(request)
        page = _int(request.query_params.get("page"), "page") or 0
        selected = r.select(f)
        shown = selected[page * PAGE_SIZE : (page + 1) * PAGE_SIZE]
        params = {k: v for k, v in request.query_params.items() if k != "page" and v != ""}
        more = (page + 1) * PAGE_SIZE < len(selected)
        next_url = "/groups?" + _query({**params, "page": str(page + 1)}) if more else None
        ctx = dict(
            run=r,
            groups=shown,
            total=len(selected),
            f=f,
            params=params,
            next_url=next_url,
            page=page,
            filtered=f.per_trajectory,
        )
        if request.headers.get("HX-Request") and page > 0:
            return render("_groups.html", **ctx)
        return render("groups.html", **ctx)

    @app.get("/group", response_class=HTMLResponse)
    def group_page(run: str | None = None, id: str = "") -> HTMLResponse:
        r = get_run(run)
        g = r.by_group.get(id)
        if g is None:
            raise HTTPException(404, f"no group {id!r} in run {r.name!r}")
        raw = r.group(id)
        nodes, height = (
            layout(raw, {t.traj_id: t.advantage for t in g.trajectories}) if g.is_tree else ([], 0)
        )
        same_task = [x for x in r.groups if x.task_id == g.task_id and x.group_id != g.group_id]
        # the nearest steps first; a long run samples a task hundreds of times
        same_task = sorted(same_task, key=lambda x: (abs(x.step - g.step), x.step))[
            :SAME_TASK_SHOWN
        ]
        return render(
            "group.html",
            run=r,
            g=g,
            raw=raw,
            nodes=nodes,
            height=height,
            same_task=same_task,
            answers=[_final_text(t) for t in raw["trajectories"]],
        )

    @app.get("/traj", response_class=HTMLResponse)
    def traj_page(run: str | None = None, id: str = "", color: str = "logprob") -> HTMLResponse:
        r = get_run(run)
        if id not in r.by_traj:
            raise HTTPException(404, f"no trajectory {id!r} in run {r.name!r}")
        if color not in QUANTITIES:
            raise HTTPException(
                400, f"color must be one of {', '.join(QUANTITIES)} (got {color!r})"
            )
        g, raw_group, t = r.trajectory(id)
        summ = g.trajectories[r.by_traj[id][1]]
        trained_version = r.version_at.get(g.step) if g.trained else None
        toks, legend = tokens_of(t, color, _model_name(r), trained_version, summ.advantage)
        session, credit = session_tree(t, raw_group)
        return render(
            "traj.html",
            session=session,
            credit=credit,
            relations=RELATIONS,
            run=r,
            g=g,
            t=t,
            s=summ,
            conversation=_conversation(t),
            tokens=toks,
            legend=legend,
            color=color,
            raw_json=json.dumps(t, indent=1, ensure_ascii=False),
            task=raw_group.get("task", {}),
        )

    @app.get("/compare", response_class=HTMLResponse)
    def compare_page(request: Request, run: str | None = None) -> HTMLResponse:
        r = get_run(run)
        q = request.query_params
        # step N vs M on the held-out tasks: the same tasks at every evaluation
        eval_steps, eval_rows = eval_table(r)
        ea = _int(q.get("ea"), "ea")
        eb = _int(q.get("eb"), "eb")
        if ea is None and eval_steps:
            ea = eval_steps[0]
        if eb is None and eval_steps:
            eb = eval_steps[-1]
        eval_raw = {}
        for row in eval_rows:
            for step in (ea, eb):
                g = row["by_step"].get(step)
                if g is not None:
                    eval_raw[(row["task_id"], step)] = r.eval_group(g.number)
        # the same training task at two steps, where the run repeats tasks
        tasks: dict[str, set[int]] = {}
        for g in r.groups:
            tasks.setdefault(g.task_id, set()).add(g.step)
        repeated = sorted(t for t, steps in tasks.items() if len(steps) > 1)
        task = q.get("task") or (repeated[0] if repeated else "")
        steps = sorted(tasks.get(task, set())) if task in repeated else []
        a = _int(q.get("a"), "a")
        b = _int(q.get("b"), "b")
        if a is None and steps:
            a = steps[0]
        if b is None and steps:
            b = steps[-1]
        sides = []
        if steps:
            for step in (a, b):
                gs = [g for g in r.groups if g.task_id == task and g.step == step]
                sides.append((step, [(g, r.group(g.group_id)) for g in gs]))
        # run A vs run B: their cards side by side and the config keys that differ
        other_name = q.get("other") or ""
        other = get_run(other_name) if other_name else None
        return render(
            "compare.html",
            run=r,
            eval_steps=eval_steps,
            eval_rows=eval_rows,
            eval_raw=eval_raw,
            ea=ea,
            eb=eb,
            tasks=repeated,
            task=task,
            steps=steps,
            a=a,
            b=b,
            sides=sides,
            final_text=_final_text,
            other=other,
            summaries=[(r.name, r.summary())] + ([(other.name, other.summary())] if other else []),
            diff=config_diff(_config(r), _config(other)) if other else [],
        )

    return app


def _query(params: dict[str, str]) -> str:
    from urllib.parse import urlencode

    return urlencode(params)


def _final_text(t: dict[str, Any]) -> str:
    turns = t.get("turns") or []
    return (turns[-1].get("text") or "") if turns else (t.get("error") or "")


def _conversation(t: dict[str, Any]) -> list[dict[str, Any]]:
    """The trajectory as messages: the prompt, then each assistant turn (with its tool calls)
    and the observation that followed it."""
    turns = t.get("turns") or []
    out: list[dict[str, Any]] = []
    turn_i = 0
    for seg in t.get("segments", []):
        kind = seg.get("kind")
        n = len(seg.get("token_ids", []))
        if kind == "prompt":
            out.append({"role": "prompt", "text": seg.get("text") or "", "tokens": n})
        elif kind == "model":
            turn = dict(turns[turn_i]) if turn_i < len(turns) else {}
            turn["calls"] = [
                {**c, "outcome": call_outcome(c), "error_text": call_error_text(c)}
                for c in turn.get("tool_calls") or []
            ]
            out.append(
                {
                    "role": "assistant",
                    "text": seg.get("text") or turn.get("text", ""),
                    "tokens": n,
                    "turn": turn,
                }
            )
            turn_i += 1
        else:
            out.append({"role": "observation", "text": seg.get("text") or "", "tokens": n})
    return out


__all__ = ["create_app"]
