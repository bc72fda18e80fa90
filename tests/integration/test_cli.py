"""The ``jobq`` command as a user types it: output, exit codes, one-line errors."""

from __future__ import annotations

import json
import socket
import subprocess
import uuid
from typing import Any

from harness.helpers import SyncDB, run_cli


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_line_error(out: Any, code: int, *fragments: str) -> None:
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobq: error: "), out.stderr
    assert "Traceback" not in out.stderr
    for frag in fragments:
        assert frag in lines[0], lines[0]


def test_publish_prints_the_id_and_stores_the_row(env: dict[str, str], db: SyncDB) -> None:
    out = run_cli(env, "publish", "emails", '{"to": "a@b.c"}')
    assert out.returncode == 0, out.stderr
    jid = uuid.UUID(out.stdout.strip())
    row = db.fetchrow("SELECT queue, status, payload::text AS p, published_at FROM jobq.job "
                      "WHERE id = $1", jid)
    assert row["queue"] == "emails" and row["status"] == "queued"
    assert row["p"] == '{"to": "a@b.c"}' and row["published_at"] is not None
    again = run_cli(env, "publish", "emails", "{}", "--idempotency-key", "k1")
    same = run_cli(env, "publish", "emails", "{}", "--idempotency-key", "k1")
    assert again.stdout == same.stdout and again.returncode == same.returncode == 0
    delayed = run_cli(env, "publish", "emails", "{}", "--delay", "60")
    assert db.val("SELECT run_at > now() + interval '50 s' FROM jobq.job WHERE id = $1",
                  uuid.UUID(delayed.stdout.strip()))


def test_invalid_json_is_refused_and_nothing_is_written(env: dict[str, str], db: SyncDB) -> None:
    one_line_error(run_cli(env, "publish", "emails", "{not json"), 1, "not valid JSON")
    one_line_error(run_cli(env, "publish", "bad queue!", "{}"), 1, "invalid queue name")
    big = '{"x": "' + "a" * 1_100_000 + '"}'
    one_line_error(run_cli(env, "publish", "emails", "-", stdin=big), 1, "byte limit")
    assert db.val("SELECT count(*) FROM jobq.job") == 0


def test_publish_lines_hands_a_file_of_payloads_to_the_relay(env: dict[str, str], db: SyncDB,
                                                            tmp_path: Any) -> None:
    payloads = [{"n": i} for i in range(2500)]
    out = run_cli(env, "publish", "imports", "-", "--lines", "--priority", "3",
                  stdin="\n".join(json.dumps(p) for p in payloads) + "\n\n")
    assert out.returncode == 0, out.stderr
    ids = [uuid.UUID(line) for line in out.stdout.split()]
    rows = db.fetch("SELECT id, payload->>'n' AS n, priority, published_at IS NULL "
                    "AND relay_after <= now() AS relays FROM jobq.job WHERE queue = 'imports'")
    assert {r["id"] for r in rows} == set(ids) and len(ids) == 2500
    assert db.val("SELECT count(DISTINCT xmin::text) FROM jobq.job "
                  "WHERE queue = 'imports'") == 3, "not 3 transactions of at most 1,000"
    assert all(r["relays"] and r["priority"] == 3 for r in rows), "not the relay's"
    by_id = {r["id"]: int(r["n"]) for r in rows}
    assert [by_id[i] for i in ids] == list(range(2500))  # printed in the file's order
    # A bad line anywhere: nothing is written, and the line is named.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ok": 1}\n{"ok": 2}\n{nope\n')
    one_line_error(run_cli(env, "publish", "imports", str(bad), "--lines"), 1, "line 3",
                   "not valid JSON")
    one_line_error(run_cli(env, "publish", "imports", str(tmp_path / "none"), "--lines"), 1,
                   "cannot read")
    one_line_error(run_cli(env, "publish", "imports", "-", "--lines", "--after", str(ids[0]),
                           stdin="{}"), 1, "--after")
    assert db.val("SELECT count(*) FROM jobq.job") == 2500
    # A batch the database refuses after others committed: said, with what got in.
    db.execute("INSERT INTO jobq.queue (name, max_payload_bytes) VALUES ('tight', 100)")
    lines = ['{"n": 1}'] * 1200 + ['{"pad": "' + "x" * 200 + '"}'] + ['{"n": 1}'] * 10
    out = run_cli(env, "publish", "tight", "-", "--lines", stdin="\n".join(lines))
    one_line_error(out, 1, "byte limit", "jobs 1001 to 1211", "the 1000 before them")
    got = {uuid.UUID(line) for line in out.stdout.split()}
    assert len(got) == 1000 and got == {r["id"] for r in db.fetch(
        "SELECT id FROM jobq.job WHERE queue = 'tight'")}


def test_unreachable_services_and_bad_urls_fail_fast_with_one_line(env: dict[str, str]) -> None:
    port = free_port()
    down_db = {**env, "JOBQ_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/x"}
    one_line_error(run_cli(down_db, "publish", "q", "{}"), 1, "cannot reach PostgreSQL",
                   f"127.0.0.1:{port}")
    one_line_error(run_cli(down_db, "migrate"), 1, "cannot reach PostgreSQL")
    down_mq = {**env, "JOBQ_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{port}/"}
    one_line_error(run_cli(down_mq, "publish", "q", "{}"), 1, "cannot reach RabbitMQ")
    bad = {**env, "JOBQ_DATABASE_URL": "mysql://nope"}
    one_line_error(run_cli(bad, "stats"), 2, "JOBQ_DATABASE_URL")
    bad = {**env, "JOBQ_CONSUMER__CONCURRENCY": "zero"}
    one_line_error(run_cli(bad, "stats"), 2, "JOBQ_CONSUMER__CONCURRENCY")


def test_unmigrated_database_says_run_migrate(env: dict[str, str], pg_admin_url: str) -> None:
    e = {**env, "JOBQ_DATABASE_URL": pg_admin_url.rsplit("/", 1)[0] + "/template1"}
    one_line_error(run_cli(e, "stats"), 2, "jobq migrate", "database template1 ")


def test_a_negative_delay_typed_on_the_command_line_is_refused(env: dict[str, str],
                                                                 db: SyncDB) -> None:
    one_line_error(run_cli(env, "publish", "emails", "{}", "--delay", "-5"), 1,
                   "--delay must be 0 or more seconds, got -5")
    assert db.val("SELECT count(*) FROM jobq.job") == 0


def test_consume_refuses_unknown_app_or_queue(env: dict[str, str]) -> None:
    one_line_error(run_cli(env, "consume", "harness.apps:app", "--queue", "nope"), 2,
                   "no handler registered for queue(s) nope")
    one_line_error(run_cli(env, "consume", "no.such.module:app"), 2, "cannot import")
    one_line_error(run_cli(env, "consume", "harness.apps"), 2, "module:attribute")
    one_line_error(run_cli(env, "consume", "harness.apps:start"), 2, "not a jobq.App")


def test_queue_settings_stats_and_inspect(env: dict[str, str], db: SyncDB) -> None:
    out = run_cli(env, "queue", "set", "emails", "--lease-seconds", "5", "--max-stalls", "2",
                  "--timeout-seconds", "60")
    assert out.returncode == 0, out.stderr
    row = db.fetchrow("SELECT * FROM jobq.queue WHERE name = 'emails'")
    assert (row["lease_s"], row["max_stalls"], row["timeout_s"]) == (5, 2, 60)
    run_cli(env, "queue", "set", "emails", "--timeout-seconds", "0")
    assert db.val("SELECT timeout_s FROM jobq.queue WHERE name = 'emails'") is None
    # Every limit that may be absent: 0 removes it, leaving it out leaves it alone.
    assert run_cli(env, "queue", "set", "emails", "--max-running", "3", "--rate-per-second",
                   "5", "--keep-completed-seconds", "60").returncode == 0
    run_cli(env, "queue", "set", "emails", "--lease-seconds", "6")
    limits = "SELECT max_running, rate_per_s, keep_completed_s FROM jobq.queue WHERE name = $1"
    assert tuple(db.fetchrow(limits, "emails")) == (3, 5, 60)
    run_cli(env, "queue", "set", "emails", "--max-running", "0", "--rate-per-second", "0",
            "--keep-completed-seconds", "0")
    assert tuple(db.fetchrow(limits, "emails")) == (None, None, None)
    one_line_error(run_cli(env, "queue", "set", "emails", "--lease-seconds", "0"), 1)
    assert "emails" in run_cli(env, "queue", "list").stdout
    # The default view fits 100 columns with every limit set on a 20-character
    # name (the full row was ~330 characters); --wide shows every column.
    name = "tenant_invoices_2026"
    assert run_cli(env, "queue", "set", name, "--max-running", "500", "--rate-per-second",
                   "2.5", "--max-running-per-key", "20", "--rate-per-second-per-key", "0.25",
                   "--timeout-seconds", "3600", "--key-policy", "fifo").returncode == 0
    assert run_cli(env, "queue", "pause", name).returncode == 0
    listed = run_cli(env, "queue", "list").stdout.splitlines()
    assert all(len(line) <= 100 for line in listed), listed
    cells = next(line for line in listed if line.startswith(name)).split()
    assert cells[1:] == ["30", "5", "3600", "≤500", "2.5/s", "≤20", "0.25/s", "fifo",
                       "paused"], cells
    wide = run_cli(env, "queue", "list", "--wide").stdout.splitlines()[0].split()
    assert {"max_stalls", "backoff_base_s", "keep_failed_s", "handlers_declare"} <= set(wide)

    jid = run_cli(env, "publish", "emails", '{"a": 1}').stdout.strip()
    stats = run_cli(env, "stats").stdout.splitlines()
    assert stats[0].split()[:9] == ["queue", "queued", "delayed", "waiting", "parked",
                                    "suspended", "running", "stalled", "completed"]
    assert stats[1].split()[:3] == ["emails", "1", "0"]
    shown = run_cli(env, "inspect", jid)
    assert shown.returncode == 0 and "queued" in shown.stdout and jid in shown.stdout
    one_line_error(run_cli(env, "inspect", str(uuid.uuid4())), 1, "no job with id")
    one_line_error(run_cli(env, "inspect", "xyz"), 1, "not a job id")


def test_stalled_jobs_show_in_sql_before_the_reaper_runs(env: dict[str, str], db: SyncDB) -> None:
    jid = uuid.UUID(run_cli(env, "publish", "emails", "{}").stdout.strip())
    db.execute("UPDATE jobq.job SET status = 'active', lock = gen_random_uuid(), "
               "worker_id = 'w-dead', lease_expires_at = now() - interval '2 s' WHERE id = $1",
               jid)
    assert [r["id"] for r in db.fetch("SELECT id FROM jobq.stalled")] == [jid]
    row = db.fetchrow("SELECT * FROM jobq.queue_stats WHERE queue = 'emails'")
    assert (row["stalled"], row["running"], row["queued"]) == (1, 0, 0)
    assert "1 (!)" in run_cli(env, "stats").stdout


def test_an_idempotency_key_reused_with_another_payload_is_said(env: dict[str, str],
                                                                 db: SyncDB) -> None:
    """Issue #50.10: it silently returned the first job's id. It still does
    (as Oban, River and BullMQ do), and now says so, once per such publish."""
    first = run_cli(env, "publish", "emails", '{"to": "a"}', "--idempotency-key", "k1")
    same = run_cli(env, "publish", "emails", '{"to": "a"}', "--idempotency-key", "k1")
    other = run_cli(env, "publish", "emails", '{"to": "b"}', "--idempotency-key", "k1")
    assert first.stdout == same.stdout == other.stdout and first.stdout.strip()
    assert "another payload" not in first.stderr + same.stderr, same.stderr
    assert (f"idempotency key 'k1' already names job {first.stdout.strip()} with another "
            "payload") in other.stderr, other.stderr
    assert db.val("SELECT payload->>'to' FROM jobq.job") == "a"
    said = [subprocess.run(["psql", env["JOBQ_DATABASE_URL"], "-Atc",
                            f"SELECT jobq.enqueue('emails', '{{\"to\": \"{to}\"}}', "
                            "idempotency_key => 'k2')"], capture_output=True, text=True)
            for to in "cd"]
    assert said[0].stdout == said[1].stdout and said[0].stdout.strip(), said
    assert "already names job" not in said[0].stderr, said[0].stderr
    assert "WARNING:  jobq: idempotency key 'k2' already names job" in said[1].stderr, said


def test_halt_on_failure_goes_with_fifo_only(env: dict[str, str], db: SyncDB) -> None:
    """#51's bad input: --halt-on-failure on a queue that is not fifo (or a
    halting queue moved to another policy) is one line and changes nothing."""
    one_line_error(run_cli(env, "queue", "set", "hq", "--halt-on-failure", "on"), 1,
                   "--halt-on-failure on needs --key-policy fifo")
    ok = run_cli(env, "queue", "set", "hq", "--key-policy", "fifo", "--halt-on-failure", "on")
    assert ok.returncode == 0, ok.stderr
    one_line_error(run_cli(env, "queue", "set", "hq", "--key-policy", "latest"), 1,
                   "turn it off before another policy")
    row = db.fetchrow("SELECT key_policy, halt_on_failure FROM jobq.queue WHERE name = 'hq'")
    assert (row["key_policy"], row["halt_on_failure"]) == ("fifo", True)
