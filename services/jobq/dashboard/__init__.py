"""``jobq dashboard``: a page that answers "what is stuck, and why did this
run twice?" (issue #18). Server-rendered (Starlette + Jinja2, served by
uvicorn), no build step, no CDN: it works offline. Every query is a named
statement of queries.sql (``dash_*``) on partial indexes; pages refresh
themselves every few seconds with one meta tag.

Read-only by default: its sessions ``SET ROLE jobq_reader`` where the login
may, so even a powerful login cannot write through it. With
``--allow-actions`` and ``JOBQ_DASHBOARD_TOKEN`` set, a signed-in operator
may retry failed jobs and cancel queued or running ones; each action is
CSRF-checked and written to the job's history with the operator's name.
Everything shown is escaped (payloads, errors and worker ids are user data).
"""
