"""Django for real (issue #50, item 7; jobq.contrib.django), with the example
project (examples/django_project): a consumer started with
DJANGO_SETTINGS_MODULE runs an app whose module imports models and whose
handler uses the ORM; a Django connection killed between two jobs costs the
second job nothing (close_old_connections around each run; without it the
thread kept the dead connection and the job failed); publish_on_commit
publishes only what commits; Django that cannot be set up is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.helpers import Procs, SyncDB, publish, run_cli, wait_until
from jobq.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "examples" / "django_project"


@pytest.fixture
def django_env(env: dict[str, str]) -> dict[str, str]:
    pytest.importorskip("django", reason="the examples' test extra")
    extra = {**env, "DATABASE_URL": env["JOBQ_DATABASE_URL"],
             "DJANGO_SETTINGS_MODULE": "signup.settings",
             "PYTHONPATH": f"{PROJECT}{os.pathsep}{env['PYTHONPATH']}"}
    out = subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=PROJECT,
                         env=extra, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    return extra


def _signup(db: SyncDB, email: str) -> int:
    return int(db.val("INSERT INTO signup_signup (email, created_at) VALUES ($1, now()) "
                      "RETURNING id", email))


def _done(db: SyncDB, jid: object) -> bool:
    return db.val("SELECT status FROM jobq.job WHERE id = $1", jid) in ("completed", "failed")


def test_orm_handlers_run_and_a_killed_connection_costs_the_next_job_nothing(
        django_env: dict[str, str], db: SyncDB, procs: Procs, settings: Settings) -> None:
    procs.reaper()
    # One thread: both jobs run on the same Django connection, if it is kept.
    procs.start("consume", "signup.tasks:app", "--concurrency", "1",
                environ=django_env).worker_id()
    first = _signup(db, "ada@example.com")
    (j1,) = publish(settings, "welcome_emails", [{"signup_id": first, "email": "x@y.z"}])
    wait_until(lambda: _done(db, j1), 30, "the first job")
    assert json.loads(db.val("SELECT result FROM jobq.job WHERE id = $1", j1)) == {
        "sent_to": "ada@example.com"}  # read through the ORM, not from the payload
    # Every session that is neither jobq's nor this test's: Django's.
    killed = db.val("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND application_name NOT LIKE 'jobq%' AND backend_type = 'client backend'")
    second = _signup(db, "grace@example.com")
    (j2,) = publish(settings, "welcome_emails", [{"signup_id": second, "email": "x@y.z"}])
    wait_until(lambda: _done(db, j2), 30, "the second job")
    row = db.fetchrow("SELECT status, errors, last_error FROM jobq.job WHERE id = $1", j2)
    assert (row["status"], row["errors"]) == ("completed", 0), (killed, dict(row))


def test_publish_on_commit_publishes_what_commits(django_env: dict[str, str],
                                                   db: SyncDB) -> None:
    script = (
        "import django; django.setup()\n"
        "from django.db import transaction\n"
        "from jobq import InvalidPayload\n"
        "from jobq.contrib.django import publish_on_commit\n"
        "from signup.models import Signup\n"
        "from signup.tasks import Welcome, send_welcome\n"
        "with transaction.atomic():\n"
        "    s = Signup.objects.create(email='kept@example.com')\n"
        "    publish_on_commit(send_welcome, Welcome(signup_id=s.id, email=s.email))\n"
        "try:\n"
        "    with transaction.atomic():\n"
        "        s = Signup.objects.create(email='gone@example.com')\n"
        "        publish_on_commit(send_welcome, Welcome(signup_id=s.id, email=s.email))\n"
        "        raise RuntimeError('rolled back')\n"
        "except RuntimeError:\n"
        "    pass\n"
        "try:\n"
        "    publish_on_commit(send_welcome, {'signup_id': 1, 'email': 'not an address'})\n"
        "except InvalidPayload as exc:\n"
        "    print('refused:', type(exc).__name__)\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=PROJECT, env=django_env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "refused: InvalidPayload" in out.stdout, out.stdout
    assert db.val("SELECT array_agg(payload->>'email') FROM jobq.job") == ["kept@example.com"]


def test_django_that_cannot_be_set_up_is_one_line(django_env: dict[str, str]) -> None:
    out = run_cli({**django_env, "DJANGO_SETTINGS_MODULE": "no_such_settings"},
                  "consume", "signup.tasks:app")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "Django could not be set up" in lines[0] and "no_such_settings" in lines[0]
