"""The consumer's pure logic, with no services: lease arithmetic and the
local trusted-until, the completion coalescer, the ack-ordering rule,
renewal planning, durations, and the one retry schedule."""

from __future__ import annotations

import asyncio
import collections
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from jobq.amqp.bodies import PACK_MAX, pack, spread, unpack
from jobq.errors import BadInput
from jobq.job import Job
from jobq.lease import Lease
from jobq.ops.common import parse_duration
from jobq.rows import Claim
from jobq.runtime.backoff import Backoff
from jobq.runtime.batch import Coalescer
from jobq.settings import ConsumerSettings
from jobq.worker.acks import Acks, Envelope
from jobq.worker.heartbeat import Heartbeat
from jobq.worker.run import Run
from jobq.worker.tally import Tally


def lease_at(sent_at: float, lease_s: float = 30.0, grace_s: float = 2.0) -> Lease:
    row = Claim(id=uuid.uuid4(), queue="q", lock=uuid.uuid4(), payload="{}", attempts=1,
                stalls=0, created_at=datetime.now(UTC), suspect=False, handoffs=0,
                lease_s=lease_s, timeout_s=None, vanished_grace_s=grace_s,
                max_result_bytes=65536, limited=False, via=uuid.uuid4())
    return Lease.from_claim(row, sent_at, 0.15)


def test_a_lease_is_trusted_until_its_margin_before_the_database_deadline() -> None:
    le = lease_at(100.0)
    assert le.trusted_until == pytest.approx(100.0 + 30 * 0.85)
    le.extend(110.0)  # a renewal sent at 110 succeeded
    assert le.trusted_until == pytest.approx(110.0 + 30 * 0.85)
    le.extend(105.0)  # a late answer to an older renewal never moves it back
    assert le.trusted_until == pytest.approx(110.0 + 30 * 0.85) and le.renewed_at == 110.0


def test_a_lost_session_cuts_trust_to_the_grace_and_a_lost_lease_is_never_extended() -> None:
    le = lease_at(100.0)
    le.session_lost(101.0)  # a reaper may cut it to 2 s from now
    assert le.trusted_until == pytest.approx(101.0 + 2 * 0.85)
    le.lost = "renewal matched no row"
    le.extend(102.0)
    assert le.trusted_until == pytest.approx(101.0 + 2 * 0.85)


def test_the_next_renewal_is_due_for_the_lease_renewed_longest_ago() -> None:
    async def go() -> float:
        runs: dict[uuid.UUID, Run] = {}
        hb = Heartbeat(ConsumerSettings(), "w", Tally(), None)  # type: ignore[arg-type]
        hb.watch(runs)
        for sent_at, lease_s in ((10.0, 30.0), (12.0, 3.0)):
            le = lease_at(sent_at, lease_s)
            job: Job[Any] = Job(le.job_id, "q", {}, 1, le.lock, "w")
            runs[job.id] = Run(job, le, None)  # type: ignore[arg-type]
        return hb._due()

    # 30 s lease renewed at 10 is due at 20; 3 s lease renewed at 12 is due at 13
    assert asyncio.run(go()) == pytest.approx(12.0 + 3.0 / 3)


def test_the_coalescer_batches_what_queues_up_and_answers_each() -> None:
    batches: list[list[int]] = []

    async def run(items: list[int]) -> list[int]:
        batches.append(items)
        await asyncio.sleep(0.01)
        return [i * 10 for i in items]

    async def go() -> list[int]:
        c: Coalescer[int, int] = Coalescer(run)
        first = asyncio.ensure_future(c.submit(0))
        await asyncio.sleep(0.001)  # its statement is in flight...
        rest = [asyncio.ensure_future(c.submit(i)) for i in range(1, 5)]  # ...these wait
        return list(await asyncio.gather(first, *rest))

    assert asyncio.run(go()) == [0, 10, 20, 30, 40]
    assert batches == [[0], [1, 2, 3, 4]]  # the first alone at once, the rest together


def test_a_failed_batch_fails_each_of_its_callers() -> None:
    async def run(items: list[int]) -> list[int]:
        raise OSError("down")

    async def go() -> list[Any]:
        c: Coalescer[int, int] = Coalescer(run)
        return list(await asyncio.gather(*(c.submit(i) for i in range(3)),
                                         return_exceptions=True))

    assert all(isinstance(r, OSError) for r in asyncio.run(go()))


class _Msg:
    def __init__(self, channel: object, tag: int, ids: int = 1, junk: bytes = b"") -> None:
        self.channel, self.delivery_tag = channel, tag
        self.routing_key = "q"
        self.body = b"\n".join([str(uuid.uuid4()).encode() for _ in range(ids)] +
                               ([junk] if junk else []))
        self.settled: list[tuple[str, bool]] = []

    async def _done(self) -> None:
        return None

    def ack(self, multiple: bool = False) -> Any:
        self.settled.append(("ack", multiple))
        return self._done()

    def nack(self, multiple: bool = False, requeue: bool = True) -> Any:
        self.settled.append(("nack", multiple))
        return self._done()

    def reject(self, requeue: bool = False) -> Any:
        self.settled.append(("reject", False))
        return self._done()


def _taken(acks: Acks, *msgs: _Msg) -> list[Envelope]:
    """Every id of these messages taken into a batch, one entry per id."""
    parts = []
    for m in msgs:
        env = Envelope(m)
        env.taken = len(env.ids)
        parts += [env] * len(env.ids)
    acks.taken(parts)
    return parts


def test_a_batch_is_acked_with_one_multiple_frame_per_channel() -> None:
    async def go() -> list[_Msg]:
        acks = Acks(collections.deque())
        a, b = object(), object()
        msgs = [_Msg(a, 1), _Msg(a, 2), _Msg(a, 3), _Msg(b, 7)]
        await acks.settle(_taken(acks, *msgs), ack=True)
        return msgs

    m = asyncio.run(go())
    assert [x.settled for x in m] == [[], [], [("ack", True)], [("ack", False)]]


def test_no_multiple_ack_over_a_lower_tag_still_unsettled() -> None:
    async def go() -> list[_Msg]:
        acks = Acks(collections.deque())
        ch = object()
        pending = _Msg(ch, 1)  # in a batch whose claim is being retried
        _taken(acks, pending)
        msgs = [_Msg(ch, 2), _Msg(ch, 3)]
        await acks.settle(_taken(acks, *msgs), ack=True)
        return [pending, *msgs]

    m = asyncio.run(go())
    assert [x.settled for x in m] == [[], [("ack", False)], [("ack", False)]]


def test_a_message_of_several_ids_is_settled_once_when_its_last_id_is() -> None:
    async def go() -> tuple[_Msg, list[list[tuple[str, bool]]]]:
        acks = Acks(collections.deque())
        msg = _Msg(object(), 1, ids=3)
        parts = _taken(acks, msg)
        seen = []
        for part in parts:  # each id's claim settles on its own
            seen.append(list(msg.settled))
            await acks.settle([part], ack=True)
        return msg, seen

    msg, seen = asyncio.run(go())
    assert seen == [[], [], []] and msg.settled == [("ack", False)]


def test_one_id_given_back_requeues_its_whole_message() -> None:
    async def go() -> _Msg:
        acks = Acks(collections.deque())
        msg = _Msg(object(), 1, ids=2)
        first, second = _taken(acks, msg)
        await acks.settle([first], ack=False)  # its claim could not be made
        await acks.settle([second], ack=True)  # claimed: dropped when redelivered
        return msg

    assert asyncio.run(go()).settled == [("nack", False)]


def test_a_body_with_lines_that_are_not_ids_runs_the_ids_then_dead_letters() -> None:
    async def go() -> tuple[list[Envelope], _Msg]:
        acks = Acks(collections.deque())
        msg = _Msg(object(), 1, ids=2, junk=b"not an id")
        parts = _taken(acks, msg)
        await acks.settle(parts, ack=True)
        return parts, msg

    parts, msg = asyncio.run(go())
    assert len(parts) == 2 and parts[0].bad == 1 and msg.settled == [("reject", False)]


def test_bodies_pack_in_order_and_read_back_as_any_client_would() -> None:
    ids = [uuid.uuid4() for _ in range(PACK_MAX + 5)]
    messages = list(pack(ids))
    assert [len(c) for c, _ in messages] == [PACK_MAX, 5]
    assert [i for c, _ in messages for i in c] == ids
    lines = [line for _, body in messages for line in body.decode().split("\n")]
    assert lines == [str(i) for i in ids]
    assert unpack(messages[1][1]) == (ids[PACK_MAX:], 0)
    assert unpack(str(ids[0]).encode() + b"\n") == ([ids[0]], 0)  # one id, as ever
    assert unpack(b"") == ([], 1) and unpack(b"\xff\xfe") == ([], 1)
    assert unpack(b"x" * 400_000) == ([], 1)  # not even decoded
    assert [spread(n) for n in (1, 16, 17, 32, 500, 5000)] == [1, 1, 2, 2, 32, 100]


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("15m", 900), ("12h", 43200),
                                               ("7d", 604800), ("2w", 1209600), ("30", 30)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-3d", "7x", "nan", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(BadInput):
        parse_duration(text)


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    b = Backoff(0.1, 0.5)
    assert [b.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    b.reset()
    assert b.next() == 0.1


def test_retry_takes_only_a_finite_delay() -> None:
    """Issue #47: Retry(delay_s=nan) or inf held the job's slot for good."""
    from jobq.errors import Retry

    for bad in (float("nan"), float("inf"), -1.0, 1e12, True, "5"):
        with pytest.raises(ValueError, match="finite number of seconds"):
            Retry(delay_s=bad)  # type: ignore[arg-type]
    assert Retry(delay_s=2.5).delay_s == 2.5 and Retry().delay_s is None


def test_a_handler_child_inherits_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #47: PGPASSWORD and *SECRET* variables reached --pool process
    children (only JOBQ_ names were looked at)."""
    from jobq.worker.child_process import child_environment

    for name in ("PGPASSWORD", "APP_SECRET", "STRIPE_API_KEY", "GITHUB_TOKEN",
                 "JOBQ_DATABASE_URL", "JOBQ_AMQP_URL", "PGPASSFILE"):
        monkeypatch.setenv(name, "s3cret")
    monkeypatch.setenv("HARNESS_DATABASE_URL", "kept: not jobq's")
    monkeypatch.setenv("LANG", "C.UTF-8")
    env = child_environment()
    assert "s3cret" not in env.values()
    assert env["LANG"] == "C.UTF-8" and "HARNESS_DATABASE_URL" in env


def test_the_schema_dump_keeps_function_lines_that_start_with_set() -> None:
    """Issue #47: schema/current.sql dropped every line starting with SET,
    and so the `SET col = ...` lines of function bodies."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "dump", Path(__file__).parents[2] / "schema" / "dump.py")
    assert spec is not None and spec.loader is not None
    dump = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dump)
    text = ("SET statement_timeout = 0;\nSET lock_timeout = 0;\n"
            "CREATE FUNCTION f() RETURNS void AS $$\nUPDATE t\nSET x = 1;\n$$;\n"
            "SET default_tablespace = '';\nCREATE TABLE t (x int);\n")
    out = dump.normalise(text)
    assert "SET x = 1;" in out and "statement_timeout" not in out
    assert "default_tablespace" not in out


def test_wrong_dashboard_sign_ins_of_other_clients_do_not_delay_the_right_one() -> None:
    """Issue #47: every sign-in took one shared turn and a wrong one slept in
    it, so 15 wrong sign-ins at once delayed the operator's by 14.7 s."""
    from jobq.dashboard.sessions import Sessions

    async def go() -> None:
        s = Sessions("the-token")
        wrong = [asyncio.create_task(s.sign_in("guess", f"10.0.0.{i}")) for i in range(15)]
        await asyncio.sleep(0)  # they all started (and wait in their own turns)
        assert await s.sign_in("the-token", "10.0.0.99") is True
        assert not any(t.done() for t in wrong)  # still waiting out their delay
        for t in wrong:
            t.cancel()
        await asyncio.gather(*wrong, return_exceptions=True)

    asyncio.run(go())


def test_a_jobs_page_names_why_it_ran_again_from_its_history() -> None:
    from jobq.dashboard.web import why_again

    events = [{"event": e} for e in ("enqueued", "claimed", "worker_vanished", "stalled",
                                     "claimed", "retry", "claimed", "suspended", "woken",
                                     "claimed", "retry", "claimed", "completed")]
    assert why_again(events) == [("a retry after an error", 2),
                                 ("a lapsed lease (its worker stopped renewing)", 1),
                                 ("woken after a sleep or a wait", 1)]
    assert why_again([{"event": "claimed"}, {"event": "claimed"}]) == [
        ("a cause the history does not show", 1)]


def test_a_workflow_graph_puts_each_job_right_of_what_it_waits_for() -> None:
    import datetime as dt
    import re

    from jobq.dashboard import graph

    t = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    a, b, c, d, outside = (uuid.UUID(int=i) for i in range(1, 6))
    steps = [{"id": i, "after": after, "status": st, "queue": "q", "created_at": t}
             for i, after, st in ((d, [b, c], "queued"), (a, [], "completed"),
                                  (b, [a, outside], "active"), (c, [a], "failed"))]
    assert graph.levels(steps) == {a: 0, b: 1, c: 1, d: 2}  # a parent outside: ignored
    drawn = graph.svg(steps)
    xs = {m[0]: int(m[1]) for m in re.findall(r'data-job="([^"]+)"><rect x="(\d+)"', drawn)}
    assert xs[str(a)] < xs[str(b)] == xs[str(c)] < xs[str(d)]
    assert drawn.count("<line ") == 4 and "#f5c6c6" in drawn  # edges; failed is red
    cyc = [{"id": a, "after": [b], "status": "queued", "queue": "q", "created_at": t},
           {"id": b, "after": [a], "status": "queued", "queue": "q", "created_at": t}]
    assert set(graph.levels(cyc).values()) <= {0, 1}  # no endless recursion on a cycle
