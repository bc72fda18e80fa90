"""Failures you can debug (issue #50, item 1): the last failure's traceback
is kept with the job (file, line, function of each frame, innermost last),
for async and sync handlers; the final failure is logged at ERROR with it;
a retried job keeps the traceback of its last failure; jobq.testing-free:
real consumer, real database. (--pool process: tests/e2e/test_inspect.py.)"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from jobq.client.results import JobFailed
from jobq.settings import Settings
from jobq.worker import tracebacks
from tests.integration.test_consumer import World, _app_db, scenario  # noqa: F401 (its fixture)


def _where(tb: str) -> None:
    """The frames of harness/apps.py's deep KeyError, innermost last."""
    assert 'harness/apps.py", line' in tb, tb
    assert tb.index("in settings_lookup") < tb.index("in read_setting"), tb
    assert tb.rstrip().endswith("KeyError: 'x'"), tb


@pytest.mark.parametrize("queue", ["work", "sync"])
def test_a_failed_jobs_traceback_is_kept_and_logged(settings: Settings, queue: str,
                                                    caplog: Any) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.publish(queue, {"deep_key": True})
        row = await w.wait_status(jid, "failed")
        assert row["last_error"] == "KeyError: 'x'"
        _where(row["last_traceback"])
        # the Python client's error carries it too
        with pytest.raises(JobFailed) as failed:
            await w.client.result(jid, timeout=5)
        assert failed.value.traceback == row["last_traceback"]

    with caplog.at_level(logging.INFO, logger="jobq.consumer"):
        scenario(settings, body, max_attempts=1)
    final = [r for r in caplog.records if r.getMessage().startswith("failed:")]
    assert final and final[0].levelno == logging.ERROR
    _where(final[0].jobq_traceback)


def test_a_retried_job_keeps_its_last_failures_traceback(settings: Settings) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.publish("work", {"fail_times": 1})
        row = await w.wait_status(jid, "completed")
        assert "RuntimeError: boom on attempt 1" in row["last_traceback"]
        assert "in _work" in row["last_traceback"]

    scenario(settings, body)


def test_a_traceback_is_bounded_and_keeps_its_last_line() -> None:
    def recurse(n: int) -> None:
        if n == 0:
            raise ValueError("x" * 20_000)
        recurse(n - 1)

    try:
        recurse(200)
    except ValueError as exc:
        text = tracebacks.text_of(exc)
    assert text is not None and len(text.encode()) <= tracebacks.MAX_BYTES
    assert text.startswith("... (earlier lines cut)") and text.rstrip().endswith("xxx")
    assert tracebacks.text_of(TimeoutError("made, never raised")) is None
