"""Retries declared next to the handler (issue #50, item 4), with real
consumer processes (harness/retry_app.py): ``fail_on`` fails at once,
``retry_on`` retries only those (the rest fail at once), the handler's
``max_attempts`` wins over the queue's in both directions, its backoff spaces
the runs, its ``timeout_s`` stops a run the queue would let go on; in async,
thread-pool and process-pool handlers. Judged from the job rows and history."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from harness.helpers import Procs, SyncDB, publish, run_cli, set_queue, wait_until
from jobq import App
from jobq.errors import ConfigError
from jobq.settings import Settings

pytestmark = pytest.mark.e2e


def _ended(db: SyncDB, ids: list[Any]) -> bool:
    return bool(db.val("SELECT count(*) FILTER (WHERE status = 'failed') = $2 FROM jobq.job "
                       "WHERE id = ANY($1)", ids, len(ids)))


def _row(db: SyncDB, jid: Any) -> Any:
    return db.fetchrow("SELECT status, errors, last_error FROM jobq.job WHERE id = $1", jid)


def test_rules_attempts_backoff_and_timeout_declared_on_the_handler(
        db: SyncDB, procs: Procs, settings: Settings, env: dict[str, str]) -> None:
    # The queues' rows say otherwise: 1 attempt where the handler says 4, 10
    # where it says 3, no timeout where it says 0.5 s.
    set_queue(db, "r_rules", max_attempts=1)
    set_queue(db, "r_backoff", max_attempts=10, backoff_base_s=0)
    set_queue(db, "r_timeout", max_attempts=1)
    set_queue(db, "r_child", max_attempts=1)
    procs.reaper()
    procs.start("consume", "harness.retry_app:app", "--queue", "r_rules", "--queue",
                "r_backoff", "--queue", "r_timeout").worker_id()
    procs.start("consume", "harness.retry_app:app", "--queue", "r_child",
                "--pool", "process").worker_id()
    value, key, conn = publish(settings, "r_rules", [{"raise": "ValueError"},
                                                     {"raise": "KeyError"},
                                                     {"raise": "ConnectionError"}])
    (slow,) = publish(settings, "r_backoff", [{"raise": "RuntimeError"}])
    (stuck,) = publish(settings, "r_timeout", [{}])
    c_value, c_conn = publish(settings, "r_child", [{"raise": "ValueError"},
                                                    {"raise": "ConnectionError"}])
    ids = [value, key, conn, slow, stuck, c_value, c_conn]
    wait_until(lambda: _ended(db, ids), 60, "every job failed for good")
    # What applies, beside each queue's row: the live consumers' declarations
    listed = run_cli(env, "queue", "list", "--wide")
    assert listed.returncode == 0, listed.stderr
    rules = next(ln for ln in listed.stdout.splitlines() if ln.startswith("r_rules "))
    assert '"max_attempts": 4' in rules and '"retry_on": ["ConnectionError"]' in rules, rules
    assert '"fail_on": ["ValueError"]' in rules, rules

    got = {jid: _row(db, jid) for jid in ids}
    assert got[value]["errors"] == 1 and "(not retried: fail_on)" in got[value]["last_error"]
    assert got[key]["errors"] == 1 and "not in retry_on" in got[key]["last_error"]
    assert got[conn]["errors"] == 4, dict(got[conn])  # the handler's 4, not the queue's 1
    assert got[slow]["errors"] == 3, dict(got[slow])  # the handler's 3, not the queue's 10
    assert "job timeout" in got[stuck]["last_error"], dict(got[stuck])
    assert got[c_value]["errors"] == 1 and "fail_on" in got[c_value]["last_error"]
    assert got[c_conn]["errors"] == 3, dict(got[c_conn])

    # The backoff: each retry's next claim no sooner than base * 2**errors
    # (0.3 s, then 0.6 s: the cap) after the failure was written.
    events = db.fetch("SELECT event, at FROM jobq.job_event WHERE job_id = $1 "
                      "AND event IN ('claimed', 'retry') ORDER BY n", slow)
    gaps = [(b["at"] - a["at"]).total_seconds() for a, b in itertools.pairwise(events)
            if a["event"] == "retry" and b["event"] == "claimed"]
    assert len(gaps) == 2 and gaps[0] >= 0.3 and gaps[1] >= 0.6, gaps


def test_a_bad_retry_option_is_one_clear_line() -> None:
    app = App()
    for options, needle in (({"max_attempts": 0}, "max_attempts"),
                            ({"backoff_base_s": float("nan")}, "backoff_base_s"),
                            ({"timeout_s": 0}, "timeout_s"),
                            ({"retry_on": (ValueError, "x")}, "retry_on"),
                            ({"retries": 3}, "unknown handler option")):
        with pytest.raises(ConfigError, match=needle) as err:
            app.handler("q", **options)
        assert "\n" not in str(err.value)
