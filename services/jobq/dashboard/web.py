"""The dashboard's routes: queues, running, stalled, failed, one job's
timeline, workers and reapers; sign-in and the two actions (retry, cancel).
A queue's job list, the find box and the favicon are ``browse.py``'s.

Who may look and act is ``sessions.py``: the operator signs in with
``JOBQ_DASHBOARD_TOKEN`` and a name; each action form carries a CSRF token
for that job and action; an action without a valid session and CSRF token,
or with a foreign Origin, is refused (403). With
``JOBQ_DASHBOARD_SIGNIN_TO_VIEW`` every page needs a session too: payloads,
results and errors are then shown to signed-in operators only.
"""

from __future__ import annotations

import functools
import json
import uuid
from pathlib import Path
from typing import Any

import asyncpg
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from jobq.dashboard import browse, charts, graph
from jobq.dashboard.sessions import COOKIE, CSP, SESSION_S, Sessions
from jobq.dashboard.store import Reads
from jobq.errors import JobqError
from jobq.ops import admin

LIMIT = 200  # rows per list page
OUTPUT_SHOWN = 50  # streamed chunks on a job page (newest first)
# What an action's redirect may say (?done=...): a fixed text, never one
# taken from the address (which anyone can write into a link).
DONE = {"retried": "retried: queued again", "cancelled": "cancelled",
        "refused": "not done: the job is not in a state that allows it (it may have "
                   "changed meanwhile)"}

_env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                   autoescape=select_autoescape(default=True, default_for_string=True))


class Dashboard:
    def __init__(self, read: asyncpg.Pool, act: asyncpg.Pool | None, token: str | None,
                 refresh_s: int = 5, *, signin_to_view: bool = False,
                 secure_cookie: bool = False) -> None:
        self.read, self.act = read, act
        self.reads = Reads(read)
        self.sessions = Sessions(token, secure_cookie)
        self.refresh_s = refresh_s
        self.signin_to_view = signin_to_view and bool(token)

    def operator(self, request: Request) -> str | None:
        return self.sessions.operator(request.cookies.get(COOKIE, ""))

    def _page(self, request: Request, template: str, refresh: bool = True,
              status: int = 200, **ctx: Any) -> HTMLResponse:
        who = self.operator(request)
        cookie = request.cookies.get(COOKIE, "")

        def csrf(purpose: object) -> str:  # one token per job and action
            return self.sessions.csrf(cookie, str(purpose)) if who else ""

        html = _env.get_template(template).render(
            actions=self.act is not None, operator=who, refresh=self.refresh_s if refresh else 0,
            csrf=csrf, path=request.url.path, **ctx)
        return HTMLResponse(html, status, headers={"Content-Security-Policy": CSP})

    def _viewer(self, request: Request) -> Response | None:
        """A redirect to sign-in when pages need a session and there is none."""
        if self.signin_to_view and self.operator(request) is None:
            return RedirectResponse("/signin", 303)
        return None

    # ── pages ──

    async def queues(self, request: Request) -> Response:
        if gate := self._viewer(request):
            return gate
        rows = await self.reads.queues()
        per_minute = await self.reads.throughput()
        series = charts.per_queue(per_minute)
        return self._page(request, "queues.html", queues=[
            {**dict(r), "done_1m": series.get(r["queue"], [0])[0],
             "chart": charts.sparkline(series.get(r["queue"], []))} for r in rows])

    async def running(self, request: Request) -> Response:
        if gate := self._viewer(request):
            return gate
        rows = await self.reads.running(LIMIT)
        return self._page(request, "running.html", jobs=[
            {**dict(r), "progress": _json(r["progress"])} for r in rows])

    async def stalled(self, request: Request) -> Response:
        if gate := self._viewer(request):
            return gate
        return self._page(request, "stalled.html",
                          jobs=await self.reads.stalled(LIMIT))

    async def failed(self, request: Request) -> Response:
        if gate := self._viewer(request):
            return gate
        return self._page(request, "failed.html",
                          jobs=await self.reads.failed(LIMIT))

    async def job(self, request: Request) -> Response:
        if gate := self._viewer(request):
            return gate
        try:
            job_id = uuid.UUID(request.path_params["id"])
        except ValueError:
            return self._page(request, "missing.html", refresh=False, status=404,
                              what="not a job id")
        row = await self.reads.job(job_id)
        if row is None:
            return self._page(request, "missing.html", refresh=False, status=404,
                              what=f"no job {job_id}")
        job = dict(row)
        for k in ("payload", "progress", "result"):
            job[k] = _json(job[k])
        events = await self.reads.history(job_id)
        return self._page(request, "job.html", job=job, events=events,
                          links=await self.reads.links(job_id),
                          steps=await self.reads.steps(job_id),
                          output=await self.reads.output(job_id, OUTPUT_SHOWN),
                          runs=sum(1 for e in events if e["event"] == "claimed"),
                          reruns=why_again(events),
                          message=DONE.get(request.query_params.get("done", ""), ""))

    async def workflow(self, request: Request) -> Response:
        if gate := self._viewer(request):
            return gate
        wid = request.path_params["id"]
        steps = await self.reads.workflow(wid)
        if not steps:
            return self._page(request, "missing.html", refresh=False, status=404,
                              what=f"no workflow {wid}")
        level = graph.levels(steps)
        ordered = sorted(steps, key=lambda s: (level[s["id"]], s["created_at"], s["id"]))
        return self._page(request, "workflow.html", workflow_id=wid, steps=ordered,
                          level=level, graph=graph.svg(steps))

    async def workers(self, request: Request) -> Response:
        if gate := self._viewer(request):
            return gate
        return self._page(request, "workers.html",
                          workers=await self.reads.workers(),
                          reapers=await self.reads.reapers())

    # ── sign-in and actions ──

    async def signin(self, request: Request) -> Response:
        if not self.sessions.token or (self.act is None and not self.signin_to_view):
            return Response("sign-in is off (set JOBQ_DASHBOARD_TOKEN and use --allow-actions "
                            "or JOBQ_DASHBOARD_SIGNIN_TO_VIEW)", 404)
        if request.method == "GET":
            return self._page(request, "signin.html", refresh=False, error="")
        form = await request.form()
        token, name = str(form.get("token", "")), str(form.get("name", "")).strip()[:60]
        client = request.client.host if request.client else "?"
        if not await self.sessions.sign_in(token, client) or not name or "|" in name:
            return self._page(request, "signin.html", refresh=False, status=403,
                              error="wrong token, or no name given")
        resp = RedirectResponse("/failed", 303)
        resp.set_cookie(COOKIE, self.sessions.cookie_for(name), httponly=True, samesite="strict",
                        secure=self.sessions.secure, max_age=SESSION_S)
        return resp

    def _acting(self, request: Request, form: Any, purpose: str) -> str | None:
        """The operator, if this is a signed-in request from our own pages
        with the CSRF token for exactly this purpose."""
        who = self.operator(request)
        origin = request.headers.get("origin")
        same_origin = origin is None or origin == f"{request.url.scheme}://{request.url.netloc}"
        cookie = request.cookies.get(COOKIE, "")
        if who is None or not same_origin or not self.sessions.csrf_ok(
                cookie, purpose, str(form.get("csrf", ""))):
            return None
        return who

    async def signout(self, request: Request) -> Response:
        form = await request.form()
        if self._acting(request, form, "signout") is None:
            return Response("refused: sign out from this dashboard's own pages", 403)
        resp = RedirectResponse("/", 303)
        resp.delete_cookie(COOKIE, httponly=True, samesite="strict", secure=self.sessions.secure)
        return resp

    async def action(self, request: Request) -> Response:
        form = await request.form()
        job_id: uuid.UUID = request.path_params["id"]  # the route converts it
        what = request.path_params["action"]
        who = self._acting(request, form, f"{what}:{job_id}")
        if who is None or self.act is None:
            return Response("refused: sign in, and act from this dashboard's own pages", 403)
        detail = f"by {who} (dashboard)"
        try:
            if what == "retry":  # the reapers' relay publishes it (relay_after = now())
                await admin.retry(self.act, job_id, detail)
                done = "retried"
            elif what == "cancel":
                await admin.cancel(self.act, job_id, f"cancelled {detail}")
                done = "cancelled"
            else:
                return Response("no such action", 404)
        except JobqError:
            done = "refused"
        return RedirectResponse(f"/job/{job_id}?done={done}", 303)

    async def queue_action(self, request: Request) -> Response:
        """Pause or resume a queue (operators, as the job actions)."""
        form = await request.form()
        queue, what = request.path_params["name"], request.path_params["action"]
        if what not in ("pause", "resume"):
            return Response("no such action", 404)
        who = self._acting(request, form, f"{what}:{queue}")
        if who is None or self.act is None:
            return Response("refused: sign in, and act from this dashboard's own pages", 403)
        try:  # recorded with the queue and logged: who, from the dashboard
            await (admin.pause if what == "pause" else admin.resume)(
                self.act, queue, f"{who} (dashboard)")
        except JobqError:
            return Response("no such queue", 404)
        return RedirectResponse("/", 303)


# What ended a run, as the reason the next one happened ("It ran 3 times: ...").
AGAIN = {"stalled": "a lapsed lease (its worker stopped renewing)",
         "retry": "a retry after an error", "released": "released by its worker (shutdown)",
         "child_died": "its child process died", "retried": "retried by an operator",
         "suspended": "woken after a sleep or a wait", "snoozed": "a snooze",
         "rate_limited": "rate limited", "superseded": "superseded"}


def why_again(events: list[Any]) -> list[tuple[str, int]]:
    """Each cause of a run after the first, with how often: the last event
    that ended a run before each later claim, from the history."""
    causes: dict[str, int] = {}
    ended: str | None = None
    claimed = False
    for e in events:
        if e["event"] == "claimed":
            if claimed:
                cause = AGAIN.get(ended or "", "a cause the history does not show")
                causes[cause] = causes.get(cause, 0) + 1
            claimed, ended = True, None
        elif e["event"] in AGAIN:
            ended = e["event"]
    return sorted(causes.items(), key=lambda kv: -kv[1])


def _json(value: Any) -> str:
    """Pretty JSON, or the text as stored when Python cannot parse it back
    (nested thousands deep, a number of thousands of digits): never a 500."""
    if value is None:
        return ""
    if not isinstance(value, str):
        return str(value)
    try:
        return json.dumps(json.loads(value), indent=2)
    except (ValueError, RecursionError):
        return value


def make_app(dash: Dashboard) -> Starlette:
    return Starlette(routes=[
        Route("/", dash.queues), Route("/running", dash.running),
        Route("/stalled", dash.stalled), Route("/failed", dash.failed),
        Route("/job/{id}", dash.job), Route("/workers", dash.workers),
        Route("/find", functools.partial(browse.find, dash)),
        Route("/queue/{name}", functools.partial(browse.queue_jobs, dash)),
        Route("/favicon.ico", browse.favicon),
        Route("/workflow/{id:uuid}", dash.workflow),
        Route("/signin", dash.signin, methods=["GET", "POST"]),
        Route("/signout", dash.signout, methods=["POST"]),
        Route("/job/{id:uuid}/{action}", dash.action, methods=["POST"]),
        Route("/queue/{name}/{action}", dash.queue_action, methods=["POST"]),
    ])
