"""Mistakes get one line, the right exit code, and no secret (issue #13);
services exit 2 on what cannot heal instead of retrying forever."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from harness.helpers import SyncDB, run_cli
from tests.integration.test_cli import one_line_error

SECRET = "S3cretPW"


def _with(env: dict[str, str], **changes: str) -> dict[str, str]:
    return {**env, **changes}


def test_a_mistyped_variable_is_refused_with_the_closest_name(env: dict[str, str]) -> None:
    out = run_cli(_with(env, JOBQ_DATABSE_URL="postgresql://x@y/z"), "stats")
    one_line_error(out, 2, "unknown setting JOBQ_DATABSE_URL", "did you mean JOBQ_DATABASE_URL")
    out = run_cli(_with(env, JOBQ_CONSUMER__CONCURENCY="3"), "stats")
    one_line_error(out, 2, "did you mean JOBQ_CONSUMER__CONCURRENCY")


@pytest.mark.parametrize("url", [
    f"postgresq://admin:{SECRET}@127.0.0.1/db",
    f"postgresql://admin:{SECRET}@127.0.0.1:notaport/db",
    f"postgresql://admin:{SECRET}@127.0.0.1:99999/db",
])
def test_a_bad_database_url_never_shows_its_password(env: dict[str, str], url: str) -> None:
    out = run_cli(_with(env, JOBQ_DATABASE_URL=url), "stats")
    one_line_error(out, 2)
    assert SECRET not in out.stderr + out.stdout


def test_a_bad_amqp_port_or_reserved_namespace_is_one_line(env: dict[str, str]) -> None:
    one_line_error(run_cli(_with(env, JOBQ_AMQP_URL=f"amqp://u:{SECRET}@h:99999/"), "stats"),
                   2, "bad port")
    one_line_error(run_cli(_with(env, JOBQ_NAMESPACE="amq"), "stats"), 2, "reserves")


def test_consume_says_what_is_wrong_with_app(env: dict[str, str]) -> None:
    one_line_error(run_cli(env, "consume", "jobq.demo:nope"), 2, "has no attribute 'nope'")
    one_line_error(run_cli(env, "consume", "../x:app"), 2, "cannot import")


@pytest.mark.parametrize("flag", ["--lease-seconds nan", "--lease-seconds inf",
                                  "--lease-seconds 1e14", "--lease-seconds -1",
                                  "--max-payload-bytes 99999999999"])
def test_queue_settings_out_of_range_are_one_line(env: dict[str, str], db: SyncDB,
                                                  flag: str) -> None:
    one_line_error(run_cli(env, "queue", "set", "q", *flag.split()), 1, flag.split()[0])


def test_queue_set_reaches_every_setting(env: dict[str, str], db: SyncDB) -> None:
    out = run_cli(env, "queue", "set", "q", "--vanished-grace-seconds", "3", "--history", "off")
    assert out.returncode == 0, out.stderr
    row = db.fetchrow("SELECT vanished_grace_s, history FROM jobq.queue WHERE name = 'q'")
    assert (row["vanished_grace_s"], row["history"]) == (3.0, False)


def test_settings_out_of_range_are_refused_from_sql_too(db: SyncDB) -> None:
    db.execute("INSERT INTO jobq.queue (name) VALUES ('q') ON CONFLICT DO NOTHING")
    for value in ("'NaN'", "'Infinity'", "1e14"):
        with pytest.raises(Exception, match="check constraint"):
            db.execute(f"UPDATE jobq.queue SET lease_s = {value} WHERE name = 'q'")


@pytest.mark.parametrize("service", ["reap", "consume"])
def test_services_exit_2_on_a_database_that_does_not_exist(env: dict[str, str],
                                                           service: str) -> None:
    url = urlsplit(env["JOBQ_DATABASE_URL"])._replace(path="/jobq_no_such_db").geturl()
    args = [service] + (["harness.apps:app"] if service == "consume" else [])
    out = run_cli(_with(env, JOBQ_DATABASE_URL=url), *args, timeout=20)
    assert out.returncode == 2, (out.returncode, out.stderr[-500:])
    assert "does not exist" in out.stderr and "Traceback" not in out.stderr


def test_services_exit_2_on_a_vhost_that_does_not_exist(env: dict[str, str]) -> None:
    url = env["JOBQ_AMQP_URL"].rstrip("/") + "/jobq_no_such_vhost"
    out = run_cli(_with(env, JOBQ_AMQP_URL=url), "reap", timeout=20)
    assert out.returncode == 2, (out.returncode, out.stderr[-500:])
    assert "vhost" in out.stderr and "Traceback" not in out.stderr


def test_prune_wants_a_unit_a_force_under_a_minute_and_can_dry_run(env: dict[str, str],
                                                                   db: SyncDB) -> None:
    jid = run_cli(env, "publish", "q", "{}").stdout.strip()
    db.execute("UPDATE jobq.job SET status = 'completed', finished_at = now() - interval '2 h' "
               "WHERE id = $1", jid)
    one_line_error(run_cli(env, "prune", "--older-than", "7"), 1, "give a unit")
    one_line_error(run_cli(env, "prune", "--older-than", "30s"), 1, "--force")
    one_line_error(run_cli(env, "prune", "--older-than", "inf"), 1, "bad duration")
    out = run_cli(env, "prune", "--older-than", "1h", "--dry-run")
    assert out.returncode == 0 and "would prune 1" in out.stdout, out.stderr
    assert db.val("SELECT count(*) FROM jobq.job") == 1  # nothing deleted
    out = run_cli(env, "prune", "--older-than", "30s", "--force")
    assert out.returncode == 0 and "pruned 1" in out.stdout, out.stderr


@pytest.mark.parametrize("payload", ["[" * 3000 + "]" * 3000, '{"n": ' + "9" * 5000 + "}"],
                         ids=["nested-3000-deep", "5000-digit-number"])
def test_publish_refuses_json_it_cannot_decode_with_one_line(env: dict[str, str],
                                                             payload: str) -> None:
    one_line_error(run_cli(env, "publish", "q", payload), 1, "payload cannot be decoded")
    # The schedule verb reads a payload the same way (it raised a traceback, exit 0).
    one_line_error(run_cli(env, "schedule", "set", "s", "q", "--every", "5", "--payload",
                           payload), 1, "--payload cannot be decoded")


def test_auto_created_queues_can_be_switched_off_and_are_capped(env: dict[str, str],
                                                                db: SyncDB) -> None:
    assert run_cli(env, "queue", "limits", "--auto-create", "off").returncode == 0
    one_line_error(run_cli(env, "publish", "brand_new", "{}"), 1, "not created on first use")
    with pytest.raises(Exception, match="not created on first use"):
        db.val("SELECT jobq.enqueue('brand_new_too')")
    assert run_cli(env, "queue", "set", "brand_new").returncode == 0  # explicit: allowed
    assert run_cli(env, "publish", "brand_new", "{}").returncode == 0
    existing = db.val("SELECT count(*) FROM jobq.queue")
    out = run_cli(env, "queue", "limits", "--auto-create", "on", "--max-queues", str(existing + 2))
    assert out.returncode == 0, out.stderr
    # One statement asking for 200 new queues gets the cap, and only the cap.
    with pytest.raises(Exception, match="over the cap"):
        db.val("SELECT count(jobq.enqueue('spam' || i)) FROM generate_series(1, 200) i")
    for i in range(2):
        db.val("SELECT jobq.enqueue($1)", f"spam{i}")
    with pytest.raises(Exception, match="over the cap"):
        db.val("SELECT jobq.enqueue('spam9')")
    assert db.val("SELECT count(*) FROM jobq.queue") == existing + 2


def test_inspect_escapes_control_characters(env: dict[str, str], db: SyncDB) -> None:
    jid = run_cli(env, "publish", "q", '{"x": "\\u001b]0;pwned\\u0007"}').stdout.strip()
    db.execute("UPDATE jobq.job SET last_error = $2 WHERE id = $1::uuid", jid,
               "boom\x1b[31m\ncompleted job=FORGED")
    out = run_cli(env, "inspect", jid)
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    assert "\\x1b[31m\\ncompleted job=FORGED" in out.stdout
    assert not any(line.startswith("completed job=FORGED") for line in out.stdout.splitlines())


def test_a_negative_duration_is_said_to_be_one(env: dict[str, str]) -> None:
    one_line_error(run_cli(env, "prune", "--older-than", "-5d"), 1, "must be a positive")


def test_an_unknown_database_url_parameter_is_one_line(env: dict[str, str]) -> None:
    url = env["JOBQ_DATABASE_URL"] + "?no_such_setting=1"
    one_line_error(run_cli(_with(env, JOBQ_DATABASE_URL=url), "stats"), 2,
                   "remove it from JOBQ_DATABASE_URL")
