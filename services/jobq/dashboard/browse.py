"""Browsing (issue #50, item 6): a queue's jobs, filtered by status, key and
workflow, a page at a time; the header's find box, for full ids and the
short ones the pages print; the favicon. ``dash`` is web.py's Dashboard
(Pages: its reads, pages and sign-in gate).

Paging is by keyset (created_at, id), newest first: a page stays the same
while new jobs arrive, and a deep page costs what a first one does.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from jobq.dashboard.store import Reads
from jobq.ops.ids import id_range
from jobq.status import Status

PAGE = 50


class Pages(Protocol):
    """What these pages need of web.py's Dashboard."""

    reads: Reads

    def _viewer(self, request: Request) -> Response | None: ...

    def _page(self, request: Request, template: str, refresh: bool = True,
              status: int = 200, **ctx: Any) -> HTMLResponse: ...

STATUSES = tuple(s.value for s in Status)
# A blue "j" on the header's colour: no file to fetch, allowed by img-src 'self'.
FAVICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">'
           '<rect width="32" height="32" rx="6" fill="#1d2430"/>'
           '<text x="16" y="24" font-size="22" font-family="sans-serif" text-anchor="middle" '
           'fill="#7fa6ff">j</text></svg>')


async def queue_jobs(dash: Pages, request: Request) -> Response:
    if gate := dash._viewer(request):
        return gate
    queue, q = request.path_params["name"], request.query_params
    status, key = q.get("status") or None, q.get("key") or None
    try:
        workflow = uuid.UUID(q["workflow"]) if q.get("workflow") else None
        before_at = datetime.fromisoformat(q["before"]) if q.get("before") else None
        before_id = uuid.UUID(q["before_id"]) if before_at is not None else None
    except (ValueError, KeyError):
        return dash._page(request, "missing.html", refresh=False, status=400,
                          what="a workflow or page that is not one (follow the page's links)")
    if status is not None and status not in STATUSES:
        return dash._page(request, "missing.html", refresh=False, status=400,
                          what=f"no status {status[:40]!r} (one of {', '.join(STATUSES)})")
    rows = await dash.reads.jobs(queue, status, key, workflow, before_at, before_id, PAGE + 1)
    more, rows = len(rows) > PAGE, rows[:PAGE]
    filters = {k: v for k, v in (("status", status), ("key", key),
                                 ("workflow", workflow and str(workflow))) if v}
    older = None
    if more:  # the next page: the same filters, before the last row shown
        last = rows[-1]
        older = "?" + urlencode({**filters, "before": last["created_at"].isoformat(),
                                 "before_id": str(last["id"])})
    return dash._page(request, "queue.html", refresh=False, queue=queue, jobs=rows,
                      statuses=STATUSES, filters=filters, older=older,
                      first_page=before_at is None)


async def find(dash: Pages, request: Request) -> Response:
    """The header's lookup box: a job or workflow id, full or short, to its page."""
    if gate := dash._viewer(request):
        return gate
    text = request.query_params.get("id", "").strip()
    try:
        exact: uuid.UUID | None = uuid.UUID(text)
    except ValueError:
        exact = None
    span = (exact, exact) if exact is not None else id_range(text)
    if span is None:
        return dash._page(request, "missing.html", refresh=False, status=404,
                          what=f"{text[:80]!r} is not a job id (a UUID, or its first 8+ "
                               "hex digits)")
    for kind, found in (("job", await dash.reads.jobs_in(*span)),
                        ("workflow", await dash.reads.workflows_in(*span))):
        if len(found) == 1:
            return RedirectResponse(f"/{kind}/{found[0]}", status_code=303)
        if found:
            return dash._page(request, "missing.html", refresh=False, status=404,
                              what=f"{text[:80]!r} is the start of several ids: give more of it")
    return dash._page(request, "missing.html", refresh=False, status=404,
                      what=f"no job or workflow {text[:80]}")


async def favicon(_request: Request) -> Response:
    return Response(FAVICON, media_type="image/svg+xml",
                    headers={"Cache-Control": "max-age=86400"})
