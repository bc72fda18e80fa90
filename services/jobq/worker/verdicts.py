"""What a handler's exception means for its job: a retry (with its delay),
a final failure (with the reason, and where it was raised), or nothing to
write because the lease is lost. Pure: the completer writes the verdict.
Snooze, RateLimited and suspension are not failures: the completer puts the
job back for those before asking here. A handler's retry rules (RetryPolicy:
fail_on, retry_on, its backoff and max_attempts) decide here, over the
queue's row."""

from __future__ import annotations

import dataclasses

from pydantic import ValidationError

from jobq.client.results import ResultInvalid
from jobq.errors import Fail, LeaseLost, Retry, SignalInvalid, StepRefused
from jobq.lease import Failure
from jobq.runtime.validation import validation_failure
from jobq.telemetry.logs import printable
from jobq.worker import tracebacks
from jobq.worker.run import Run


class PayloadUndecodable(Exception):
    """The stored payload cannot be decoded (too deep, a huge number): it never will be."""


class JobqFault(Exception):
    """jobq itself failed while running a job: recorded as that run's failure."""


class JobTimeout(TimeoutError):
    """The run passed its timeout_s and was stopped (a TimeoutError, as before)."""


def _verdict(run: Run, exc: BaseException) -> Failure | None:
    """What a handler's exception means for the job; None: the lease is lost."""
    le, queue, policy = run.lease, run.job.queue, run.handler.policy
    if isinstance(exc, Retry):
        return Failure(le, f"Retry: {printable(str(exc))}", True, exc.delay_s, policy)
    if isinstance(exc, Fail):
        return Failure(le, f"Fail: {printable(str(exc))}", False)
    if isinstance(exc, SignalInvalid):  # built again on every run: retrying cannot help
        return Failure(le, f"{printable(str(exc))}", False)
    if isinstance(exc, StepRefused):  # the same on every run: retrying cannot help
        return Failure(le, f"step refused: {printable(str(exc))}", False)
    if isinstance(exc, ResultInvalid):
        return Failure(le, f"result not stored: {printable(str(exc))}", False)
    if isinstance(exc, PayloadUndecodable):
        return Failure(le, f"payload cannot be decoded: {printable(str(exc))}", False)
    if isinstance(exc, ValidationError):
        return Failure(le, validation_failure(queue, exc), False)
    if isinstance(exc, LeaseLost):
        return None
    name = type(exc).__name__
    text = printable(str(exc))
    error = f"{name}: {text}" if text else name
    # The handler's fail_on / retry_on, for its own exceptions only: not
    # jobq's fault nor the run's timeout; one from a child process was judged
    # there, where its class is (child.py sends the reason).
    theirs = not (isinstance(exc, JobqFault | JobTimeout) or hasattr(exc, "remote_traceback"))
    refused = getattr(exc, "jobq_refused", None) or (policy.refused(exc) if theirs else None)
    if refused:
        return Failure(le, f"{error} (not retried: {refused})", False)
    return Failure(le, error, True, None, policy)


def failure_for(run: Run, exc: BaseException) -> Failure | None:
    """What a handler's exception means for the job, with where it was
    raised; None: the lease is lost."""
    failure = _verdict(run, exc)
    if failure is None:
        return None
    # A child process's handler: the child formatted its own (processes.py).
    tb = getattr(exc, "remote_traceback", None) or tracebacks.text_of(exc)
    return dataclasses.replace(failure, traceback=tb)
