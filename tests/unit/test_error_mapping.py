"""Error classification and the handler-error mapping, with no services:
which driver errors are retried (transient), which are the caller's or the
operator's mistake, and what a handler's exception does to its job."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel, ValidationError

from jobq.db import is_transient, translated
from jobq.errors import (
    BadInput,
    ConfigError,
    DatabaseUnavailable,
    Fail,
    InvalidQueue,
    LeaseLost,
    Retry,
    StepRefused,
)
from jobq.handlers import Handler
from jobq.job import Job
from jobq.lease import Lease
from jobq.runtime.retries import RetryPolicy
from jobq.telemetry.logs import printable
from jobq.worker.run import Run, Stop
from jobq.worker.verdicts import JobqFault, JobTimeout, PayloadUndecodable, failure_for


def _pg(cls: type[asyncpg.PostgresError]) -> asyncpg.PostgresError:
    made: asyncpg.PostgresError = cls.new({"M": "boom", "C": cls.sqlstate or "XX000"},
                                          query=None)
    return made


@pytest.mark.parametrize("exc", [
    OSError("refused"), TimeoutError(), asyncpg.InterfaceError("closed"),
    asyncpg.InternalClientError("cannot switch to state 12; another operation (2)"),
    asyncpg.exceptions.ConnectionDoesNotExistError("gone"),
    _pg(asyncpg.exceptions.AdminShutdownError), _pg(asyncpg.exceptions.CannotConnectNowError),
    _pg(asyncpg.exceptions.TooManyConnectionsError), _pg(asyncpg.exceptions.DeadlockDetectedError),
    _pg(asyncpg.exceptions.SerializationError), _pg(asyncpg.exceptions.QueryCanceledError),
])
def test_connection_and_conflict_errors_are_transient(exc: BaseException) -> None:
    assert is_transient(exc)
    with pytest.raises(DatabaseUnavailable), translated():
        raise exc
    try:
        with translated():
            raise exc
    except DatabaseUnavailable as translated_exc:
        assert is_transient(translated_exc)


@pytest.mark.parametrize(("exc", "becomes"), [
    (_pg(asyncpg.exceptions.UndefinedTableError), ConfigError),
    (_pg(asyncpg.exceptions.InvalidPasswordError), ConfigError),
    (_pg(asyncpg.exceptions.InvalidParameterValueError), InvalidQueue),
    (_pg(asyncpg.exceptions.CheckViolationError), BadInput),
])
def test_mistakes_are_not_transient(exc: BaseException, becomes: type[Exception]) -> None:
    assert not is_transient(exc)
    with pytest.raises(becomes), translated():
        raise exc


@pytest.mark.parametrize("exc", [
    _pg(asyncpg.exceptions.PostgresSyntaxError), _pg(asyncpg.exceptions.DatetimeFieldOverflowError),
    ValueError("a bug"), KeyError("k"),
])
def test_bugs_and_bad_data_are_not_transient(exc: BaseException) -> None:
    assert not is_transient(exc)


def _run(policy: RetryPolicy | None = None) -> Run:
    job: Job[Any] = Job(uuid.uuid4(), "q", {}, 1, uuid.uuid4(), "w")
    le = Lease(job.id, "q", job.lock, 30.0, 0.15, 25.5)
    run = Run(job, le, Handler("q", lambda j: None, False, None, policy or RetryPolicy()))
    return run


class Model(BaseModel):
    to: str


def test_a_handlers_exception_decides_retry_or_failure() -> None:
    run = _run()
    r = failure_for(run, Retry("later", delay_s=3))
    assert r is not None and (r.retry, r.delay_s, r.error) == (True, 3, "Retry: later")
    f = failure_for(run, Fail("never"))
    assert f is not None and (f.retry, f.error) == (False, "Fail: never")
    u = failure_for(run, PayloadUndecodable("RecursionError"))
    assert u is not None and not u.retry and "cannot be decoded" in u.error
    with pytest.raises(ValidationError) as info:
        Model.model_validate({})
    v = failure_for(run, info.value)
    assert v is not None and not v.retry and "at to" in v.error
    assert failure_for(run, LeaseLost("gone")) is None
    s = failure_for(run, StepRefused("step 'charge' was recorded by a.f, not a.g"))
    assert s is not None and not s.retry and s.error.startswith("step refused: step 'charge'")
    e = failure_for(run, RuntimeError("boom\ncompleted job=FORGED"))
    assert e is not None and e.retry and e.error == "RuntimeError: boom\\ncompleted job=FORGED"
    assert failure_for(run, KeyError()).error == "KeyError"  # type: ignore[union-attr]
    assert e.delay_s is None and e.policy == RetryPolicy()  # the queue's row decides


def test_a_handlers_retry_policy_decides_over_the_queue() -> None:
    policy = RetryPolicy(max_attempts=7, backoff_base_s=2, backoff_max_s=30,
                         retry_on=(ConnectionError,), fail_on=(ConnectionRefusedError,))
    ok = failure_for(_run(policy), ConnectionResetError("reset"))
    # attempts and backoff go to the fail statement with the failure (the queue's
    # row is the default there); no delay of its own
    assert ok is not None and ok.retry and (ok.delay_s, ok.policy) == (None, policy)
    refused = failure_for(_run(policy), ConnectionRefusedError("no"))  # fail_on wins
    assert refused is not None and not refused.retry and "(not retried: fail_on)" in refused.error
    other = failure_for(_run(policy), KeyError("k"))
    assert other is not None and not other.retry and "not in retry_on" in other.error
    # jobq's own failures are not the handler's exceptions: the rules leave them
    for ours in (JobqFault("bug"), JobTimeout("job timeout")):
        f = failure_for(_run(policy), ours)
        assert f is not None and f.retry, ours
    told = failure_for(_run(policy), Retry("later", delay_s=4))
    assert told is not None and told.retry and told.delay_s == 4  # its own delay wins


def test_printable_escapes_control_characters_and_cuts() -> None:
    assert printable("a\nb\r\x1b]0;title\x07") == "a\\nb\\r\\x1b]0;title\\x07"
    assert printable("x" * 10, 4) == "xxxx... (6 more characters)"


def test_a_run_stops_once_and_remembers_the_first_reason() -> None:
    run = _run()
    assert run.ours
    assert run.stop(Stop.TIMEOUT) is True
    assert run.stop(Stop.LOST) is False
    assert run.stop_reason is Stop.TIMEOUT and not run.ours and run.job.stop_requested.is_set()


@pytest.mark.parametrize(("exc", "kind"), [
    (__import__("aiormq").exceptions.ProbableAuthenticationError("refused"), "transient"),
    (__import__("aiormq").exceptions.ChannelPreconditionFailed("args differ"), "queue"),
    (__import__("aiormq").exceptions.ChannelAccessRefused("no configure"), "queue"),
    (__import__("aiormq").exceptions.ChannelNotFoundEntity("gone"), "queue"),
    (__import__("aiormq").exceptions.ConnectionClosed(320, "forced"), "transient"),
    (__import__("aiormq").exceptions.ChannelInvalidStateError("closed"), "transient"),
    (__import__("aiormq").exceptions.DeliveryError(None, None), "transient"),
    (ConnectionResetError(), "transient"), (TimeoutError(), "transient"),
])
def test_broker_errors_are_classified(exc: BaseException, kind: str) -> None:
    """QUEUE_REFUSED stays with its one queue; the rest of TRANSIENT is the
    broker or the connection (refused credentials are caught before, at
    connect, as a ConfigError)."""
    from jobq.amqp.connect import QUEUE_REFUSED, TRANSIENT

    assert isinstance(exc, TRANSIENT)
    assert isinstance(exc, QUEUE_REFUSED) is (kind == "queue")


@pytest.mark.parametrize(("exc", "broken"), [
    (_pg(asyncpg.exceptions.DeadlockDetectedError), False),  # a conflict: the session goes on
    (_pg(asyncpg.exceptions.SerializationError), False),
    (_pg(asyncpg.exceptions.QueryCanceledError), False),
    (_pg(asyncpg.exceptions.CheckViolationError), False),
    (_pg(asyncpg.exceptions.AdminShutdownError), True),  # terminated backend
    (asyncpg.InternalClientError("another operation (2) is in progress"), True),
    (asyncpg.exceptions.ConnectionDoesNotExistError("gone"), True),
    (TimeoutError(), True),  # abandoned mid-statement
    (ValueError("a bug"), True),
])
def test_which_errors_leave_a_session_unfit_for_reuse(exc: BaseException, broken: bool) -> None:
    from jobq.db import session_broken

    assert session_broken(exc) is broken
    try:
        with translated():
            raise exc
    except Exception as translated_exc:  # the same answer through the jobq error tree
        assert session_broken(translated_exc) is broken
