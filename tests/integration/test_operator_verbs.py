"""Operator verbs a new user missed (issue #33), run as a user types them:
bulk cancel and retry of a queue with dry runs and counts, `queue delete`
refused while jobs are live, a new queue name said on stderr, `jobq … |
head` without a traceback, a taken dashboard port as one line, and
`jobq uninstall` removing the schema and the broker namespace while another
database's jobq keeps the shared roles."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import uuid

import aio_pika
import pytest

from harness.helpers import SyncDB, as_role, run_cli
from jobq.settings import Settings
from tests.integration.test_cli import free_port, one_line_error


def _publish(env: dict[str, str], queue: str, n: int) -> list[uuid.UUID]:
    return [uuid.UUID(run_cli(env, "publish", queue, "{}").stdout.strip()) for _ in range(n)]


def _statuses(db: SyncDB, queue: str) -> dict[str, int]:
    return {r["status"]: r["n"] for r in db.fetch(
        "SELECT status::text, count(*) AS n FROM jobq.job WHERE queue = $1 GROUP BY 1", queue)}


def test_bulk_cancel_and_retry_of_a_queue_count_first_and_touch_only_it(
        env: dict[str, str], db: SyncDB) -> None:
    _publish(env, "imports", 3)
    other = _publish(env, "exports", 1)
    dry = run_cli(env, "cancel", "--queue", "imports", "--dry-run")
    assert dry.stdout.strip() == "would cancel 3 job(s) of imports", dry.stderr
    assert _statuses(db, "imports") == {"queued": 3}
    out = run_cli(env, "cancel", "--queue", "imports", "--reason", "bad batch")
    assert out.stdout.strip() == "cancelled 3 job(s) of imports", out.stderr
    assert _statuses(db, "imports") == {"cancelled": 3}
    assert db.val("SELECT status FROM jobq.job WHERE id = $1", other[0]) == "queued"
    assert db.val("SELECT count(*) FROM jobq.job_event WHERE event = 'cancelled' "
                  "AND detail LIKE 'bad batch (by %)' AND worker_id IS NULL") == 3
    db.execute("UPDATE jobq.job SET status = 'failed' WHERE queue = 'imports' AND id = "
               "(SELECT min(id::text)::uuid FROM jobq.job WHERE queue = 'imports')")
    dry = run_cli(env, "retry", "--queue", "imports", "--dry-run")
    assert dry.stdout.strip() == "would retry 1 job(s) of imports"
    out = run_cli(env, "retry", "--queue", "imports", "--status", "failed",
                  "--status", "cancelled")
    assert out.stdout.strip() == "queued 3 job(s) of imports again", out.stderr
    assert _statuses(db, "imports") == {"queued": 3}
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'imports' "
                  "AND published_at IS NOT NULL") == 3  # published at once, not by the relay
    one_line_error(run_cli(env, "cancel"), 1, "give a job id or --queue QUEUE")
    one_line_error(run_cli(env, "cancel", str(other[0]), "--dry-run"), 1, "go with --queue")


def test_queue_delete_is_refused_while_jobs_are_live_then_removes_it_all(
        env: dict[str, str], db: SyncDB, settings: Settings) -> None:
    _publish(env, "typo", 2)
    one_line_error(run_cli(env, "queue", "delete", "typo"), 1, "2 queued or running job(s)",
                   "jobq cancel --queue typo")
    assert run_cli(env, "cancel", "--queue", "typo").returncode == 0
    dry = run_cli(env, "queue", "delete", "typo", "--dry-run")
    assert dry.stdout.strip() == "would delete queue typo and its 2 finished job(s)"
    out = run_cli(env, "queue", "delete", "typo")
    assert out.stdout.strip() == "deleted queue typo and its 2 finished job(s)", out.stderr
    assert db.val("SELECT count(*) FROM jobq.queue WHERE name = 'typo'") == 0
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'typo'") == 0
    assert not asyncio.run(_broker_has(settings, queue=f"{settings.namespace}.typo"))
    one_line_error(run_cli(env, "queue", "delete", "typo"), 1, "no queue named 'typo'")


def test_a_new_queue_name_is_said_on_stderr_once(env: dict[str, str]) -> None:
    first = run_cli(env, "publish", "emials", "{}")
    assert first.returncode == 0 and "created queue 'emials'" in first.stderr
    again = run_cli(env, "publish", "emials", "{}")
    assert again.returncode == 0 and again.stderr == ""


def test_output_into_a_closed_pipe_ends_quietly(env: dict[str, str], db: SyncDB) -> None:
    db.execute("INSERT INTO jobq.queue (name) SELECT 'q' || n FROM generate_series(1, 1500) n")
    out = subprocess.run(f"{sys.executable} -m jobq queue list | head -1", shell=True,
                         env=as_role(env, ["queue", "list"]), capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.startswith("name"), out.stdout
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr


def test_a_taken_dashboard_port_is_one_line(env: dict[str, str]) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        out = run_cli(env, "dashboard", "--port", str(port), timeout=30)
    one_line_error(out, 2, f"port {port} on 127.0.0.1 is in use", "--port")


async def _broker_has(settings: Settings, *, queue: str | None = None,
                      exchange: str | None = None) -> bool:
    conn = await aio_pika.connect(settings.amqp_url)
    try:
        ch = await conn.channel()
        if queue:
            await ch.declare_queue(queue, passive=True)
        else:
            await ch.declare_exchange(exchange or "", passive=True)
        return True
    except aio_pika.exceptions.ChannelClosed:
        return False
    finally:
        await conn.close()


def test_uninstall_says_what_then_removes_schema_and_namespace_only(
        env: dict[str, str], db: SyncDB, settings: Settings) -> None:
    assert run_cli(env, "migrate", "--declare").returncode == 0
    _publish(env, "emails", 2)
    dry = run_cli(env, "uninstall")
    assert dry.returncode == 0 and "would remove schema jobq of database" in dry.stdout
    assert "2 job(s)" in dry.stdout and "run `jobq uninstall --yes`" in dry.stderr
    assert db.val("SELECT to_regnamespace('jobq') IS NOT NULL")
    out = run_cli(env, "uninstall", "--yes")
    assert out.returncode == 0, out.stderr
    assert db.val("SELECT to_regnamespace('jobq') IS NULL")
    assert db.val("SELECT count(*) FROM pg_default_acl") == 0
    ns = settings.namespace
    assert not asyncio.run(_broker_has(settings, exchange=ns))
    assert not asyncio.run(_broker_has(settings, queue=f"{ns}.emails"))
    assert not asyncio.run(_broker_has(settings, queue=f"{ns}.dead"))
    # The run's template database still has jobq: the shared roles stay.
    assert "kept roles" in out.stdout and db.val(
        "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'jobq\\_%'") == 5
    assert run_cli(env, "migrate").returncode == 0  # and it installs again
    assert os.environ.get("JOBQ_NAMESPACE") != ns


@pytest.mark.parametrize("verb", ["uninstall", "cancel", "retry", "queue"])
def test_help_texts_exist(verb: str) -> None:
    out = subprocess.run([sys.executable, "-m", "jobq", verb, "--help"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and len(out.stdout) > 200
