"""One job to publish, and its options: declared once, used by every publish.

:class:`JobOptions` is what every publish takes besides a queue and a
payload (``Client.publish``, ``Client.enqueue``, ``SyncClient.publish``, a
typed task's ``publish``/``publish_sync``/``job``, ``Workflow.step``,
``jobq.testing``'s client): each of those signatures is ``**options:
Unpack[JobOptions]``, so mypy checks every option by name and type, and
:func:`options_of` refuses an unknown one at run time. :class:`NewJob` holds
one job; :func:`validate` is every check a publish makes before it writes.
:data:`COLUMNS` maps a job to the named arrays of ``jobq.enqueue_many`` (and
the single-job statement ``enqueue_linked``), in the statement's order.

Adding an option: one field here (TypedDict and NewJob), one entry in
COLUMNS (if the batch statement takes it), one migration for the SQL.
Modelled on DBOS ``_enqueue_options.py`` and River's ``InsertOpts``.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypedDict

from jobq.errors import MAX_DELAY_S, InvalidPayload
from jobq.queues import BY_COLUMN, check_queue_name

_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")  # a JSON-escaped NUL, not an escaped backslash
# The highest max_payload_bytes a queue may have (schema/0003): larger is
# refused here, before it is sent; the queue's own limit is checked in SQL.
MAX_PAYLOAD_BYTES = int(BY_COLUMN["max_payload_bytes"].hi)
MAX_PARENTS = 1000


class JobOptions(TypedDict, total=False):
    """How a job is published. ``delay_s``: not before then; ``idempotency_key``:
    a second publish with it (by the same login) is the first job;
    ``priority`` 0..9, higher first; ``key``: who the job is for (per-key caps,
    rates and fairness); ``debounce_s`` with a key: jobs of the queue and key
    published within that time run once, with the last payload, that long
    after the last publish; ``after``: job ids it runs after, once each
    completed (cancelled, with the reason, if one failed); ``expires_in_s``:
    not started within that many seconds of the publish, the job is
    cancelled with reason ``expired`` and never runs. How long an idempotency
    key holds: ``idempotency_while_live`` (until its job ends) or
    ``idempotency_window_s`` (that long after the publish); by default as
    long as the job is kept. ``on_duplicate``: ``"return"`` the holder's id
    (the default) or ``"refuse"`` (:class:`jobq.DuplicateJob`, naming it)."""

    delay_s: float
    idempotency_key: str | None
    priority: int
    key: str | None
    debounce_s: float
    after: Iterable[uuid.UUID]
    expires_in_s: float | None
    idempotency_window_s: float | None
    idempotency_while_live: bool
    on_duplicate: Literal["return", "refuse"]


OPTIONS = frozenset(JobOptions.__annotations__)


@dataclass(frozen=True)
class NewJob:
    """One job to publish: a queue, a payload and its options (JobOptions).
    ``workflow_id`` is set by a :class:`jobq.Workflow`, not by callers."""

    queue: str
    payload: Any = None
    delay_s: float = 0.0
    idempotency_key: str | None = None
    priority: int = 0
    key: str | None = None
    debounce_s: float = 0.0
    after: Sequence[uuid.UUID] = field(default=())
    expires_in_s: float | None = None
    idempotency_window_s: float | None = None
    idempotency_while_live: bool = False
    on_duplicate: Literal["return", "refuse"] = "return"
    workflow_id: uuid.UUID | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.after, tuple):  # any iterable of ids, kept as a tuple
            object.__setattr__(self, "after", tuple(self.after))

    @property
    def waits(self) -> bool:
        """Published by the relay when due (or released), not by the producer now."""
        return self.delay_s > 0 or self.debounce_s > 0 or bool(self.after)

    @property
    def linked(self) -> bool:
        """Enqueued one by one through jobq.enqueue (workflow.py), not in a
        batch: jobq.enqueue_many takes no after, workflow, deadline or key hold."""
        return (bool(self.after) or self.workflow_id is not None
                or self.expires_in_s is not None or self.idempotency_window_s is not None
                or self.idempotency_while_live or self.on_duplicate != "return")

    def options(self) -> JobOptions:
        """Its options that differ from the defaults (a workflow step keeps them)."""
        return options_of({f.name: getattr(self, f.name) for f in fields(self)
                           if f.name in OPTIONS and getattr(self, f.name) != f.default})


def options_of(given: Mapping[str, Any], where: str = "publish") -> JobOptions:
    """``given`` as JobOptions; TypeError naming an unknown option, as a
    keyword argument that does not exist would (``**options`` takes any)."""
    unknown = sorted(set(given) - OPTIONS)
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r} "
                        f"(options: {', '.join(sorted(OPTIONS))})")
    out: JobOptions = {**given}  # type: ignore[typeddict-item]
    return out


def new_job(queue: str, payload: Any, options: Mapping[str, Any],
            where: str = "publish") -> NewJob:
    """A NewJob of ``queue`` with the options given to a publish (their names
    checked; their types are mypy's, through ``Unpack[JobOptions]``)."""
    known: Any = options_of(options, where)  # after: any iterable; NewJob keeps a tuple
    return NewJob(queue, payload, **known)


def validate(job: NewJob) -> str:
    """Check a job's queue name, options and payload; the payload as JSON text."""
    check_queue_name(job.queue)
    delay = job.delay_s
    # `not delay < MAX` is also true for NaN; a negative delay means "now".
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not delay < MAX_DELAY_S:
        raise InvalidPayload(f"delay_s must be a finite number of seconds under a year, "
                             f"got {delay!r}")
    if job.idempotency_key is not None and len(job.idempotency_key.encode()) > 200:
        raise InvalidPayload("idempotency key is over 200 bytes: use a short key "
                             "(e.g. a hash of what makes the job unique)")
    check_flow(job)
    try:
        text = json.dumps({} if job.payload is None else job.payload, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidPayload(f"payload is not JSON-serialisable: {type(exc).__name__}: "
                             f"{str(exc)[:200]}") from exc
    if _NUL.search(text):  # found by the property-based input tests
        raise InvalidPayload("payload contains a NUL character (\\u0000), which PostgreSQL's "
                             "jsonb cannot store; remove it or encode the data")
    if len(text) > MAX_PAYLOAD_BYTES:  # checked before it crosses the wire
        raise InvalidPayload(f"payload is {len(text)} bytes, over the {MAX_PAYLOAD_BYTES} "
                             "byte limit any queue can have; pass a reference instead")
    return text


def check_flow(job: NewJob) -> None:
    """priority, key, debounce_s, after and expires_in_s are what jobq.enqueue
    accepts."""
    p = job.priority
    if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= 9:
        raise InvalidPayload(f"priority must be a whole number 0 to 9 (higher first), got {p!r}")
    k = job.key
    if k is not None and (not isinstance(k, str) or not 1 <= len(k.encode()) <= 200
                          or "\x00" in k):
        raise InvalidPayload("key must be 1 to 200 bytes of text without NUL (a tenant or "
                             f"customer id, or a hash of one), got {str(k)[:40]!r}")
    d = job.debounce_s
    if isinstance(d, bool) or not isinstance(d, int | float) or not 0 <= d < MAX_DELAY_S:
        raise InvalidPayload(f"debounce_s must be a finite number of seconds under a year, "
                             f"got {d!r}")
    if len(job.after) > MAX_PARENTS:
        raise InvalidPayload(f"a job may wait for at most {MAX_PARENTS} jobs, "
                             f"got {len(job.after)}")
    if not all(isinstance(a, uuid.UUID) for a in job.after):
        raise InvalidPayload("after takes job ids (uuid.UUID), as publish returns them")
    e = job.expires_in_s
    if e is not None and (isinstance(e, bool) or not isinstance(e, int | float)
                          or not 0 < e < MAX_DELAY_S):
        raise InvalidPayload(f"expires_in_s must be a positive number of seconds under a "
                             f"year, got {e!r}")
    if e is not None and e <= max(job.delay_s, 0):
        raise InvalidPayload(f"expires_in_s ({e}) is not after delay_s ({job.delay_s}): the "
                             "job could never start; both count from the publish")
    if e is not None and d > 0:
        raise InvalidPayload("a debounced job takes no expires_in_s")
    check_key_hold(job)
    if d > 0 and (k is None or job.idempotency_key is not None):
        raise InvalidPayload("debounce_s needs a key (what the jobs collapse on) and no "
                             "idempotency key")


def check_key_hold(job: NewJob) -> None:
    """idempotency_window_s, idempotency_while_live and on_duplicate as
    jobq.enqueue accepts them."""
    w = job.idempotency_window_s
    if w is not None and (isinstance(w, bool) or not isinstance(w, int | float)
                          or not 0 < w < MAX_DELAY_S):
        raise InvalidPayload(f"idempotency_window_s must be a positive number of seconds "
                             f"under a year, got {w!r}")
    if not isinstance(job.idempotency_while_live, bool):
        raise InvalidPayload("idempotency_while_live is True or False, got "
                             f"{job.idempotency_while_live!r}")
    if (w is not None or job.idempotency_while_live) and job.idempotency_key is None:
        raise InvalidPayload("idempotency_window_s and idempotency_while_live need an "
                             "idempotency_key")
    if w is not None and job.idempotency_while_live:
        raise InvalidPayload("pass idempotency_window_s or idempotency_while_live, not both")
    if job.on_duplicate not in ("return", "refuse"):
        raise InvalidPayload(f"on_duplicate must be 'return' or 'refuse', got "
                             f"{job.on_duplicate!r}")


# A job (its checked payload text beside it) as the statements' arguments:
# jobq.enqueue_many's arrays, in the order queries.sql's enqueue_many passes
# them (tests/unit/test_newjob.py holds the two to each other).
Column = Callable[[NewJob, str], Any]
COLUMNS: tuple[tuple[str, Column], ...] = (
    ("queues", lambda j, _: j.queue),
    ("payloads", lambda _, text: text),
    ("delays_s", lambda j, _: max(0.0, float(j.delay_s))),
    ("idempotency_keys", lambda j, _: j.idempotency_key),
    ("priorities", lambda j, _: j.priority),
    ("keys", lambda j, _: j.key),
    ("debounces_s", lambda j, _: float(j.debounce_s)),
)


def arrays(jobs: Sequence[NewJob], texts: Sequence[str]) -> list[list[Any]]:
    """One array per COLUMNS entry, a value per job."""
    return [[get(j, t) for j, t in zip(jobs, texts)] for _, get in COLUMNS]
