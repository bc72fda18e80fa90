"""`jobq schedule set|list|delete` as a user types them: both spellings of
the queue and interval, a cron in a time zone, one line for every mistake."""

from __future__ import annotations

from harness.helpers import SyncDB, run_cli


def test_set_list_delete_and_mistakes(env: dict[str, str], db: SyncDB) -> None:
    ok = run_cli(env, "schedule", "set", "nightly", "reports", "--cron", "0 3 * * *",
                 "--tz", "Europe/Berlin", "--payload", '{"kind": "daily"}')
    assert ok.returncode == 0, ok.stderr
    ok = run_cli(env, "schedule", "set", "ping", "--queue", "pings", "--interval", "30")
    assert ok.returncode == 0, ok.stderr
    rows = db.fetch("SELECT name, queue, cron, timezone, interval_s, payload, "
                    "next_run_at > now() AS ahead FROM jobq.schedule ORDER BY name")
    assert [(r["name"], r["queue"], r["cron"], r["timezone"], r["interval_s"], r["ahead"])
            for r in rows] == [("nightly", "reports", "0 3 * * *", "Europe/Berlin", None, True),
                               ("ping", "pings", None, "UTC", 30.0, True)]
    listed = run_cli(env, "schedule", "list")
    assert "cron 0 3 * * * Europe/Berlin" in listed.stdout and "every 30s" in listed.stdout
    for args, needle in (
            (["nightly", "reports", "--cron", "0 25 * * *"], "bad cron expression"),
            (["x", "q", "--every", "0.1"], "interval"),
            (["x", "q", "--cron", "* * * * *", "--tz", "Nowhere/City"], "time zone"),
            (["x", "--every", "5"], "queue once"),
            (["x", "q", "--every", "5", "--payload", "{nope"], "not valid JSON")):
        bad = run_cli(env, "schedule", "set", *args)
        assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1 and needle in bad.stderr, bad.stderr
    deleted = run_cli(env, "schedule", "delete", "ping")
    assert deleted.returncode == 0 and deleted.stdout.startswith("deleted schedule ping:"), \
        deleted.stdout  # it printed "(none)", an empty table, on success
    gone = run_cli(env, "schedule", "delete", "ping")
    assert gone.returncode == 1 and "no schedule named" in gone.stderr
    assert db.val("SELECT count(*) FROM jobq.schedule") == 1
