"""The dashboard's routes: queues, running, stalled, failed, one job's
timeline, workers and reapers; sign-in and the two actions (retry, cancel).

Sessions: the operator signs in with ``JOBQ_DASHBOARD_TOKEN`` and a name;
the cookie holds the name and an HMAC of it under the token (HttpOnly,
SameSite=Strict). Each action form carries a CSRF token, an HMAC of the
session under the token; an action without a valid session and CSRF token,
or with a foreign Origin, is refused (403).
"""

from __future__ import annotations

import hashlib
import hmac
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

from jobq import admin
from jobq.dashboard import charts
from jobq.db import fetch
from jobq.errors import JobqError
from jobq.sql import Q

LIMIT = 200  # rows per list page
COOKIE = "jobq_dashboard"

_env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                   autoescape=select_autoescape(default=True, default_for_string=True))


def _sign(token: str, text: str) -> str:
    return hmac.new(token.encode(), text.encode(), hashlib.sha256).hexdigest()


class Dashboard:
    def __init__(self, read: asyncpg.Pool, act: asyncpg.Pool | None, token: str | None,
                 refresh_s: int = 5) -> None:
        self.read, self.act, self.token = read, act, token
        self.refresh_s = refresh_s

    # ── sessions ──

    def operator(self, request: Request) -> str | None:
        if self.act is None or not self.token:
            return None
        raw = request.cookies.get(COOKIE, "")
        name, _, mac = raw.rpartition("|")
        if name and hmac.compare_digest(mac, _sign(self.token, "session:" + name)):
            return name
        return None

    def csrf(self, request: Request) -> str:
        assert self.token
        return _sign(self.token, "csrf:" + request.cookies.get(COOKIE, ""))

    def _page(self, request: Request, template: str, refresh: bool = True,
              **ctx: Any) -> HTMLResponse:
        who = self.operator(request)
        html = _env.get_template(template).render(
            actions=self.act is not None, operator=who, refresh=self.refresh_s if refresh else 0,
            csrf=self.csrf(request) if who else "", path=request.url.path, **ctx)
        return HTMLResponse(html, headers={
            "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
                                       "img-src 'self' data:; form-action 'self'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"})

    # ── pages ──

    async def queues(self, request: Request) -> HTMLResponse:
        rows = await fetch(self.read, Q["dash_queues"])
        per_minute = await fetch(self.read, Q["dash_throughput"])
        series = charts.per_queue(per_minute)
        return self._page(request, "queues.html", queues=[
            {**dict(r), "done_1m": series.get(r["queue"], [0])[0],
             "chart": charts.sparkline(series.get(r["queue"], []))} for r in rows])

    async def running(self, request: Request) -> HTMLResponse:
        rows = await fetch(self.read, Q["dash_running"], LIMIT)
        return self._page(request, "running.html", jobs=[
            {**dict(r), "progress": _json(r["progress"])} for r in rows])

    async def stalled(self, request: Request) -> HTMLResponse:
        return self._page(request, "stalled.html",
                          jobs=await fetch(self.read, Q["dash_stalled"], LIMIT))

    async def failed(self, request: Request) -> HTMLResponse:
        return self._page(request, "failed.html",
                          jobs=await fetch(self.read, Q["dash_failed"], LIMIT))

    async def job(self, request: Request) -> Response:
        try:
            job_id = uuid.UUID(request.path_params["id"])
        except ValueError:
            return self._page(request, "missing.html", refresh=False, what="not a job id")
        rows = await fetch(self.read, Q["dash_job"], job_id)
        if not rows:
            return self._page(request, "missing.html", refresh=False, what=f"no job {job_id}")
        job = dict(rows[0])
        for k in ("payload", "progress", "result"):
            job[k] = _json(job[k])
        events = await fetch(self.read, Q["history"], job_id)
        return self._page(request, "job.html", job=job, events=events,
                          runs=sum(1 for e in events if e["event"] == "claimed"),
                          message=request.query_params.get("message", ""))

    async def workers(self, request: Request) -> HTMLResponse:
        return self._page(request, "workers.html",
                          workers=await fetch(self.read, Q["dash_workers"]),
                          reapers=await fetch(self.read, Q["dash_reapers"]))

    # ── sign-in and actions ──

    async def signin(self, request: Request) -> Response:
        if self.act is None or not self.token:
            return Response("actions are off (jobq dashboard --allow-actions)", 404)
        if request.method == "GET":
            return self._page(request, "signin.html", refresh=False, error="")
        form = await request.form()
        token, name = str(form.get("token", "")), str(form.get("name", "")).strip()[:60]
        if not name or not hmac.compare_digest(token, self.token):
            return self._page(request, "signin.html", refresh=False,
                              error="wrong token, or no name given")
        resp = RedirectResponse("/failed", 303)
        resp.set_cookie(COOKIE, f"{name}|{_sign(self.token, 'session:' + name)}",
                        httponly=True, samesite="strict", max_age=8 * 3600)
        return resp

    async def action(self, request: Request) -> Response:
        who = self.operator(request)
        form = await request.form()
        origin = request.headers.get("origin")
        same_origin = origin is None or origin == f"{request.url.scheme}://{request.url.netloc}"
        if who is None or not same_origin or not hmac.compare_digest(
                str(form.get("csrf", "")), self.csrf(request)):
            return Response("refused: sign in, and act from this dashboard's own pages", 403)
        assert self.act is not None
        job_id: uuid.UUID = request.path_params["id"]  # the route converts it
        what = request.path_params["action"]
        detail = f"by {who} (dashboard)"
        try:
            if what == "retry":  # the reapers' relay publishes it (relay_after = now())
                await admin.retry(self.act, job_id, detail)
                message = "retried: queued again"
            elif what == "cancel":
                await admin.cancel(self.act, job_id, f"cancelled {detail}")
                message = "cancelled"
            else:
                return Response("no such action", 404)
        except JobqError as exc:
            message = f"not done: {exc}"
        from urllib.parse import quote

        return RedirectResponse(f"/job/{job_id}?message={quote(message)}", 303)


def _json(value: Any) -> str:
    if value is None:
        return ""
    return json.dumps(json.loads(value), indent=2) if isinstance(value, str) else str(value)


def make_app(dash: Dashboard) -> Starlette:
    return Starlette(routes=[
        Route("/", dash.queues), Route("/running", dash.running),
        Route("/stalled", dash.stalled), Route("/failed", dash.failed),
        Route("/job/{id}", dash.job), Route("/workers", dash.workers),
        Route("/signin", dash.signin, methods=["GET", "POST"]),
        Route("/job/{id:uuid}/{action}", dash.action, methods=["POST"]),
    ])
