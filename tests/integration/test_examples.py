"""docs/how-to/frameworks.md runs as written (issue #32): its blocks that name a file
under examples/ are that file, verbatim; the Django project's view enqueues
inside transaction.atomic() (a signup and its job commit together, a bad one
leaves neither) and a consumer of its tasks runs the job; the FastAPI app's
lifespan client publishes through a typed handle and waits for the result;
the psycopg and SQLAlchemy scripts enqueue iff their transaction commits."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.helpers import Procs, SyncDB, wait_until

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "how-to" / "frameworks.md"


def blocks() -> dict[str, str]:
    """The page's ```python blocks by the file named on their first line."""
    out = {}
    for b in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S):
        first, _, rest = b.partition("\n")
        assert first.startswith("# ") and first.endswith(".py"), f"unnamed block: {first!r}"
        out[first[2:]] = rest
    return out


def _run(env: dict[str, str], code: str | list[str], cwd: Path, **extra: str) -> str:
    args = [sys.executable, "-c", code] if isinstance(code, str) else [sys.executable, *code]
    out = subprocess.run(args, cwd=cwd, env={**env, **extra}, capture_output=True, text=True,
                         timeout=90)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_blocks_naming_example_files_are_those_files() -> None:
    named = {k: v for k, v in blocks().items() if k.startswith("examples/")}
    assert len(named) == 3
    for path, text in named.items():
        assert (ROOT / path).read_text() == text, f"{path} and docs/how-to/frameworks.md differ"


def test_django_view_enqueues_in_its_transaction_and_the_job_runs(
        env: dict[str, str], db: SyncDB, procs: Procs) -> None:
    pytest.importorskip("django", reason="the examples' test extra")
    project = ROOT / "examples" / "django_project"
    extra = {"DATABASE_URL": env["JOBQ_DATABASE_URL"], "DJANGO_SETTINGS_MODULE": "signup.settings",
             "PYTHONPATH": f"{project}{os.pathsep}{env['PYTHONPATH']}"}
    _run(env, ["manage.py", "migrate", "-v", "0"], project, **extra)
    said = _run(env, (
        "import django, json; django.setup()\n"
        "from django.test import Client\n"
        "c = Client()\n"
        "ok = c.post('/signup', {'email': 'ada@example.com'})\n"
        "bad = c.post('/signup', {'email': 'not an address'})\n"
        "print(json.dumps([ok.status_code, ok.json(), bad.status_code]))"), project, **extra)
    ok_status, ok, bad_status = json.loads(said.strip().splitlines()[-1])
    assert (ok_status, bad_status) == (201, 400)
    assert db.val("SELECT array_agg(email) FROM signup_signup") == ["ada@example.com"]
    assert db.val("SELECT count(*) FROM jobq.job") == 1  # the bad signup left no job
    procs.reaper()
    procs.start("consume", "signup.tasks:app", environ=extra)
    wait_until(lambda: db.val("SELECT status FROM jobq.job WHERE id = $1::uuid",
                              ok["job"]) == "completed", 30, "the welcome job")
    assert json.loads(db.val("SELECT result FROM jobq.job")) == {"sent_to": "ada@example.com"}


def test_fastapi_lifespan_client_publishes_and_waits_for_the_result(
        env: dict[str, str], db: SyncDB, procs: Procs) -> None:
    pytest.importorskip("fastapi", reason="the examples' test extra")
    app_dir = ROOT / "examples" / "fastapi_app"
    extra = {"PYTHONPATH": f"{app_dir}{os.pathsep}{env['PYTHONPATH']}"}
    procs.reaper()
    procs.start("consume", "reports:app", environ=extra)
    said = _run(env, (
        "import json\n"
        "from fastapi.testclient import TestClient\n"
        "from main import api\n"
        "with TestClient(api) as c:\n"
        "    job = c.post('/reports', json={'customer': 'acme', 'month': '2026-11'}).json()\n"
        "    done = c.get(f\"/reports/{job['job']}\", params={'wait': 30})\n"
        "    bad = c.post('/reports', json={'customer': 'acme'})\n"
        "    unknown = c.get('/reports/00000000-0000-0000-0000-000000000001',\n"
        "                    params={'wait': 1}).status_code\n"
        "    sse = c.get(f\"/reports/{job['job']}/events\").text\n"
        "    resumed = c.get(f\"/reports/{job['job']}/events\",\n"
        "                    headers={'Last-Event-ID': '1'}).text\n"
        "print(json.dumps([job, done.status_code, done.json(), bad.status_code, sse, resumed,\n"
        "                  unknown]))"),
        app_dir, **extra)
    job, status, result, bad, sse, resumed, unknown = json.loads(said.strip().splitlines()[-1])
    assert (status, bad, unknown) == (200, 422, 404)
    assert sse == ('id: 1\ndata: {"step": "query", "customer": "acme"}\n\n'
                   'id: 2\ndata: {"step": "render", "month": "2026-11"}\n\n'
                   'event: end\ndata: {}\n\n'), sse
    assert resumed.startswith("id: 2\n") and resumed.count("id: ") == 1, resumed
    assert result == {"customer": "acme", "url": "/files/2026-11.pdf"}
    assert db.val("SELECT key FROM jobq.job WHERE id = $1::uuid", job["job"]) == "acme"


def _script(name: str, tmp_path: Path, env: dict[str, str]) -> str:
    (tmp_path / name).write_text(blocks()[name])
    return _run(env, [name], tmp_path, DATABASE_URL=env["JOBQ_DATABASE_URL"])


def test_psycopg_and_sqlalchemy_enqueue_iff_the_transaction_commits(
        env: dict[str, str], db: SyncDB, procs: Procs, tmp_path: Path) -> None:
    pytest.importorskip("psycopg", reason="the examples' test extra")
    pytest.importorskip("sqlalchemy", reason="the examples' test extra")
    _script("psycopg_example.py", tmp_path, env)
    out = _script("sqlalchemy_example.py", tmp_path, env)
    assert db.val("SELECT array_agg(id ORDER BY id) FROM orders") == [42, 44]
    orders = db.val("SELECT array_agg((payload->>'order')::int ORDER BY payload->>'order') "
                    "FROM jobq.job WHERE queue = 'invoices'")
    assert orders == [42, 44]  # 43 rolled back with its order
    assert out.startswith("enqueued ")
    procs.reaper()  # the relay publishes what SQL enqueued
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE published_at IS NOT NULL")
               == 2, 20, "the relay's publish")


def test_the_handles_example_runs_as_written(env: dict[str, str], db: SyncDB,
                                             tmp_path: Path) -> None:
    _script("handles_example.py", tmp_path, env)
    rows: Any = db.fetch("SELECT payload->>'to' AS to, priority, run_at > now() AS later "
                         "FROM jobq.job WHERE queue = 'emails' ORDER BY 1")
    assert [(r["to"], r["priority"], r["later"]) for r in rows] == [
        ("a@example.com", 5, False), ("b@example.com", 0, True)]
