"""The worker's flow against the fake store (harness/fake_store.py), without
services: the real Intake, Executor, Completer and Heartbeat, wired as the
consumer wires them, fed fake deliveries. claim -> run -> complete, retry
or fail; the ack policy; lost leases and self-fencing; the idempotent
retries of every final write; the drain. The same rules run against
PostgreSQL and RabbitMQ in tests/integration and tests/e2e."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

from harness.fake_store import FakeStore
from jobq.app import App
from jobq.errors import ConfigError, DatabaseUnavailable, Fail, Retry
from jobq.job import Job
from jobq.settings import ConsumerSettings
from jobq.telemetry import metrics
from jobq.telemetry import tracing as tracing_mod
from jobq.worker import executor as executor_mod
from jobq.worker import handback as handback_mod
from jobq.worker import intake as intake_mod
from jobq.worker import progress as progress_mod
from jobq.worker.run import Stop
from jobq.worker.tally import Tally
from jobq.worker.units import assemble

T = TypeVar("T")


class Channel:
    """Settles like AMQP: ack(multiple) settles every lower tag too."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, int, bool]] = []  # (verb, tag, multiple)
        self.msgs: list[Message] = []


class Message:
    def __init__(self, channel: Channel, tag: int, body: bytes) -> None:
        self.channel, self.delivery_tag, self.body = channel, tag, body
        self.routing_key = "q"
        self.settled: str | None = None
        channel.msgs.append(self)

    async def _settle(self, verb: str, multiple: bool) -> None:
        self.channel.frames.append((verb, self.delivery_tag, multiple))
        for m in self.channel.msgs:
            lower = multiple and m.delivery_tag <= self.delivery_tag
            if m.settled is None and (m is self or lower):
                m.settled = verb

    def ack(self, multiple: bool = False) -> Awaitable[None]:
        return self._settle("ack", multiple)

    def nack(self, multiple: bool = False, requeue: bool = True) -> Awaitable[None]:
        return self._settle("nack" if requeue else "drop", multiple)

    def reject(self, requeue: bool = False) -> Awaitable[None]:
        return self._settle("reject" if not requeue else "nack", False)


class World:
    """One consumer's units around a fake store, on this event loop."""

    def __init__(self, handler: Callable[..., Any], *, concurrency: int = 2,
                 payload: type[BaseModel] | None = None, **cfg: Any) -> None:
        self.app = App()
        self.app.handler("q", payload=payload)(handler)
        self.store = FakeStore(["q"])
        self.cfg = ConsumerSettings(**cfg)
        self.tally = Tally()
        self.stop = asyncio.Event()
        self.handed: list[tuple[list[uuid.UUID], str]] = []  # ids published back, singly
        self.broker_away = False  # then no hand back is confirmed
        units = assemble(self.app, self.cfg, self.store, worker_id="w", queues=["q"],
                         concurrency=concurrency, tally=self.tally, stop=self.stop,
                         hand_back=self._hand_back)
        self.hb, self.completer = units.heartbeat, units.completer
        self.executor, self.intake = units.executor, units.intake
        self.runs = self.executor.runs
        self.channel = Channel()
        self._tag = 0
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> World:
        self._tasks = [asyncio.create_task(self.hb.loop()),
                       asyncio.create_task(self.intake.loop())]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        self.intake.wake()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for t in list(self.executor.tasks):
            t.cancel()
        self.executor.close()

    async def _hand_back(self, ids: list[uuid.UUID], queue: str) -> set[uuid.UUID]:
        self.handed.append((ids, queue))
        return set() if self.broker_away else set(ids)

    def deliver(self, *bodies: uuid.UUID | bytes) -> list[Message]:
        out = []
        for b in bodies:
            self._tag += 1
            msg = Message(self.channel, self._tag, b if isinstance(b, bytes) else str(b).encode())
            self.intake.on_message(msg)  # a Settleable, as a Delivery is
            out.append(msg)
        return out

    async def until(self, cond: Callable[[], bool], within: float = 3.0) -> None:
        """Wait for a condition of the world (fails the test if it never holds)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + within
        while not cond():
            assert loop.time() < end, "condition not reached"
            await asyncio.sleep(0.005)

    async def idle(self) -> None:
        await self.until(lambda: not self.executor.tasks and not self.intake._inbox
                         and not self.intake.retries)

    def status(self, job_id: uuid.UUID) -> str:
        return self.store.rows[job_id].status


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 10))


async def ok(job: Job) -> str:
    return "done"


async def boom(job: Job) -> None:
    raise ValueError("bad")


async def forever(job: Job) -> None:
    await asyncio.sleep(60)


# ── claim, run, complete ──

def test_a_delivered_job_is_claimed_run_completed_and_its_message_acked() -> None:
    async def go() -> None:
        async with World(ok) as w:
            jid = w.store.add()
            (msg,) = w.deliver(jid)
            await w.until(lambda: w.status(jid) == "completed")
            await w.idle()
            assert msg.settled == "ack" and w.store.rows[jid].result == '"done"'
            assert w.tally.counters["completed"] == 1 and w.runs == {}
    run(go())


def test_the_message_is_acked_only_after_the_claim_is_durable() -> None:
    async def go() -> None:
        async with World(ok) as w:
            jid = w.store.add()
            w.store.fail_next("claim", DatabaseUnavailable("down"))
            gate = asyncio.Event()
            real = w.store.claim

            async def slow_claim(*a: Any) -> Any:
                await gate.wait()  # the retry's claim is still on its way
                return await real(*a)
            w.store.claim = slow_claim  # type: ignore[method-assign,assignment]
            (msg,) = w.deliver(jid)
            await asyncio.sleep(0.05)
            assert msg.settled is None and w.status(jid) == "queued"
            gate.set()
            await w.until(lambda: w.status(jid) == "completed")
            assert msg.settled == "ack"
    run(go())


def test_a_batch_is_claimed_in_one_statement_and_acked_with_one_frame() -> None:
    async def go() -> None:
        async with World(ok, concurrency=8) as w:
            ids = [w.store.add() for _ in range(5)]
            msgs = w.deliver(*ids)
            await w.until(lambda: all(w.status(i) == "completed" for i in ids))
            assert w.store.named("claim") == [ids]
            assert [m.settled for m in msgs] == ["ack"] * 5
            assert w.channel.frames == [("ack", msgs[-1].delivery_tag, True)]
    run(go())


def test_a_message_of_several_ids_runs_them_all_and_is_acked_after_the_last() -> None:
    async def go() -> None:
        gate = asyncio.Event()

        async def held(job: Job) -> None:
            await gate.wait()
        async with World(held, concurrency=2) as w:
            ids = [w.store.add() for _ in range(5)]
            (msg,) = w.deliver("\n".join(map(str, ids)).encode())
            await w.until(lambda: len(w.runs) == 2)
            assert msg.settled is None  # three ids still wait for a slot
            gate.set()
            await w.until(lambda: all(w.status(i) == "completed" for i in ids))
            assert msg.settled == "ack" and w.channel.frames == [("ack", 1, False)]
            assert [i for c in w.store.named("claim") for i in c] == ids  # in order
            assert w.handed == []  # slots kept freeing: nothing handed back
    run(go())


def handed_back_metric() -> float:
    return metrics.REGISTRY.get_sample_value("jobq_ids_handed_back_total", {"queue": "q"}) or 0.0


def test_ids_held_while_no_slot_frees_go_back_one_message_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handback_mod, "HOLD_S", 0.05)
    before = handed_back_metric()

    async def go() -> None:
        async with World(forever, concurrency=1) as w:
            ids = [w.store.add() for _ in range(4)]
            (msg,) = w.deliver("\n".join(map(str, ids)).encode())
            await w.until(lambda: msg.settled is not None)
            assert w.handed == [(ids[1:], "q")] and msg.settled == "ack"
            assert list(w.runs) == [ids[0]] and w.tally.counters["handed_back"] == 3
            assert handed_back_metric() == before + 3  # what /metrics shows
            assert [w.status(i) for i in ids[1:]] == ["queued"] * 3
    run(go())


def test_ids_of_an_old_message_go_back_even_while_slots_free(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handback_mod, "AGE_S", 0.2)

    async def go() -> None:
        async def brief(job: Job) -> None:
            await asyncio.sleep(0.02)  # a slot frees every 20 ms: never HOLD_S
        async with World(brief, concurrency=1) as w:
            ids = [w.store.add() for _ in range(20)]
            (msg,) = w.deliver("\n".join(map(str, ids)).encode())
            await w.until(lambda: msg.settled is not None)
            ((back, _),) = w.handed
            ran = [i for c in w.store.named("claim") for i in c]
            # some ran one after another (slots kept freeing), the rest went back
            assert ran + back == ids and 1 < len(ran) < 20, (len(ran), len(back))
    run(go())


def test_a_hand_back_the_broker_refuses_is_tried_once_each_hold_not_in_a_spin(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handback_mod, "HOLD_S", 0.05)
    monkeypatch.setattr(handback_mod, "AGE_S", 0.0)  # the message is "old" at once

    async def go() -> None:
        async with World(forever, concurrency=1) as w:
            w.broker_away = True
            ids = [w.store.add() for _ in range(3)]
            (msg,) = w.deliver("\n".join(map(str, ids)).encode())
            await w.until(lambda: len(w.handed) >= 2)
            t0 = asyncio.get_running_loop().time()
            n0 = len(w.handed)
            await w.until(lambda: len(w.handed) >= n0 + 3)
            took = asyncio.get_running_loop().time() - t0
            # three tries took at least two holds (a spin makes thousands a second)
            assert took >= 2 * 0.05 * 0.9, f"{len(w.handed) - n0} tries in {took:.3f}s"
            assert msg.settled is None and list(w.runs) == [ids[0]]  # still held, not lost
            w.broker_away = False
            await w.until(lambda: msg.settled == "ack")
    run(go())


def test_a_body_with_one_line_not_an_id_runs_the_rest_and_is_dead_lettered() -> None:
    async def go() -> None:
        async with World(ok) as w:
            ids = [w.store.add() for _ in range(2)]
            (msg,) = w.deliver(f"{ids[0]}\nnonsense\n{ids[1]}".encode())
            await w.until(lambda: msg.settled is not None)
            await w.until(lambda: all(w.status(i) == "completed" for i in ids))
            assert msg.settled == "reject" and w.tally.counters["malformed"] == 1
    run(go())


def test_no_more_jobs_run_at_once_than_the_slots() -> None:
    async def go() -> None:
        running, most = 0, 0

        async def slow(job: Job) -> None:
            nonlocal running, most
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.05)
            running -= 1
        async with World(slow, concurrency=2) as w:
            ids = [w.store.add() for _ in range(6)]
            w.deliver(*ids)
            await w.until(lambda: all(w.status(i) == "completed" for i in ids))
            assert most == 2
    run(go())


def test_a_sync_handler_runs_in_a_thread_and_completes() -> None:
    def sync(job: Job) -> int:
        return 7

    async def go() -> None:
        async with World(sync) as w:
            jid = w.store.add()
            w.deliver(jid)
            await w.until(lambda: w.status(jid) == "completed")
            assert w.store.rows[jid].result == "7"
    run(go())


# ── the ack policy for what cannot be claimed ──

def test_a_body_that_is_not_a_job_id_is_dead_lettered() -> None:
    async def go() -> None:
        async with World(ok) as w:
            (bad,) = w.deliver(b"not-a-uuid")
            await w.until(lambda: bad.settled is not None)
            assert bad.settled == "reject" and w.tally.counters["malformed"] == 1
            assert w.store.named("claim") == []
    run(go())


def test_an_unknown_id_is_acked_and_dropped() -> None:
    async def go() -> None:
        async with World(ok) as w:
            (msg,) = w.deliver(uuid.uuid4())
            await w.until(lambda: msg.settled is not None)
            await w.idle()
            assert msg.settled == "ack" and w.tally.counters["unknown_job"] == 1
    run(go())


def test_a_duplicate_delivery_runs_the_job_once() -> None:
    async def go() -> None:
        calls = 0

        async def count(job: Job) -> None:
            nonlocal calls
            calls += 1
        async with World(count) as w:
            jid = w.store.add()
            msgs = w.deliver(jid, jid)
            await w.until(lambda: w.status(jid) == "completed")
            await w.idle()
            assert calls == 1 and [m.settled for m in msgs] == ["ack", "ack"]
            assert w.tally.counters["duplicate"] == 1
    run(go())


def test_a_job_not_due_yet_is_dropped_for_the_relay() -> None:
    async def go() -> None:
        async with World(ok) as w:
            jid = w.store.add(run_at=asyncio.get_running_loop().time() + 60)
            (msg,) = w.deliver(jid)
            await w.until(lambda: msg.settled is not None)
            await w.idle()
            assert msg.settled == "ack" and w.tally.counters["not_due"] == 1
            assert w.status(jid) == "queued"
    run(go())


def test_a_job_of_another_queue_is_not_run_here() -> None:
    async def go() -> None:
        async with World(ok) as w:
            jid = w.store.add(queue="elsewhere")
            (msg,) = w.deliver(jid)
            await w.until(lambda: msg.settled is not None)
            await w.idle()
            assert w.tally.counters["foreign_queue"] == 1 and w.status(jid) == "queued"
    run(go())


# ── claims that fail ──

def test_a_claim_that_fails_transiently_is_retried_with_the_same_tokens() -> None:
    async def go() -> None:
        async with World(ok) as w:
            jid = w.store.add()
            w.store.lose_reply("claim")  # the first claim committed, its reply was lost
            (msg,) = w.deliver(jid)
            await w.until(lambda: w.status(jid) == "completed")
            assert msg.settled == "ack" and len(w.store.named("claim")) == 2
            assert w.store.rows[jid].attempts == 1  # recognised as ours, not claimed twice
    run(go())


def test_a_claim_that_keeps_failing_requeues_the_message_never_drops_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intake_mod, "CLAIM_TRIES", 3)  # 50 + 100 ms apart, not 6 up to 1.6 s

    async def go() -> None:
        async with World(ok) as w:
            jid = w.store.add()
            w.store.fail_next("claim", *[DatabaseUnavailable("down")] * 4)  # first + 3 tries
            (msg,) = w.deliver(jid)
            await w.until(lambda: msg.settled is not None)
            assert msg.settled == "nack" and w.status(jid) == "queued"
            assert w.tally.counters["claim_unavailable"] == 1
    run(go())


def test_a_job_whose_data_breaks_the_claim_is_failed_alone() -> None:
    async def go() -> None:
        async with World(ok) as w:
            bad, good = w.store.add(poison=True), w.store.add()
            msgs = w.deliver(bad, good)
            await w.until(lambda: w.status(good) == "completed")
            await w.until(lambda: all(m.settled for m in msgs))
            assert w.status(bad) == "failed" and [m.settled for m in msgs] == ["ack", "ack"]
            assert w.tally.counters["unclaimable"] == 1
    run(go())


def test_a_claim_error_nothing_can_heal_stops_intake_and_requeues() -> None:
    async def go() -> None:
        async with World(ok) as w:
            jid = w.store.add()
            w.store.fail_next("claim", ConfigError("permission denied for function q_claim"))
            (msg,) = w.deliver(jid)
            await w.until(lambda: w._tasks[1].done())
            assert isinstance(w._tasks[1].exception(), ConfigError)
            assert msg.settled == "nack" and w.status(jid) == "queued"
    run(go())


# ── how a handler's end is recorded ──

def test_an_error_is_retried_then_failed_after_max_attempts() -> None:
    async def go() -> None:
        async with World(boom) as w:
            jid = w.store.add(max_attempts=2)
            w.deliver(jid)
            await w.until(lambda: w.status(jid) == "queued" and w.store.rows[jid].attempts == 1)
            await w.idle()
            await asyncio.sleep(0.02)  # due again
            w.deliver(jid)
            await w.until(lambda: w.status(jid) == "failed")
            assert w.store.rows[jid].error == "ValueError: bad"
            assert (w.tally.counters["retried"], w.tally.counters["failed"]) == (1, 1)
    run(go())


def test_retry_asks_for_its_delay_and_fail_stops_at_once() -> None:
    async def go() -> None:
        async def later(job: Job) -> None:
            raise Retry("rate limited", delay_s=12.5)

        async def never(job: Job) -> None:
            raise Fail("no such customer")
        async with World(later) as w:
            jid = w.store.add()
            w.deliver(jid)
            await w.until(lambda: w.status(jid) == "queued" and bool(w.store.named("fail")))
            assert w.store.named("fail")[0][0][1:] == ("Retry: rate limited", True, 12.5)
        async with World(never) as w:
            jid = w.store.add(max_attempts=5)
            w.deliver(jid)
            await w.until(lambda: w.status(jid) == "failed")
            assert w.store.named("fail")[0][0][1:3] == ("Fail: no such customer", False)
    run(go())


def test_a_payload_that_is_not_json_fails_without_a_retry() -> None:
    async def go() -> None:
        async with World(ok) as w:
            jid = w.store.add(payload="{not json", max_attempts=5)
            w.deliver(jid)
            await w.until(lambda: w.status(jid) == "failed")
            assert w.store.rows[jid].error.startswith("payload cannot be decoded")  # type: ignore[union-attr]
    run(go())


def test_a_payload_its_model_refuses_fails_without_a_retry() -> None:
    class Email(BaseModel):
        to: str

    async def go() -> None:
        async with World(ok, payload=Email) as w:
            jid = w.store.add(payload='{"from": "x"}', max_attempts=5)
            w.deliver(jid)
            await w.until(lambda: w.status(jid) == "failed")
            assert "failed validation for queue q" in (w.store.rows[jid].error or "")
    run(go())


def test_a_result_that_cannot_be_stored_fails_the_job() -> None:
    async def unjson(job: Job) -> object:
        return object()

    async def go() -> None:
        async with World(unjson) as w:
            jid = w.store.add()
            w.deliver(jid)
            await w.until(lambda: w.status(jid) == "failed")
            assert (w.store.rows[jid].error or "").startswith("result not stored")
    run(go())


def test_a_handler_past_its_timeout_is_stopped_and_failed() -> None:
    async def go() -> None:
        async with World(forever) as w:
            jid = w.store.add(timeout_s=0.05)
            w.deliver(jid)
            await w.until(lambda: bool(w.store.named("fail")))
            assert "job timeout" in w.store.named("fail")[0][0][1]
    run(go())


# ── the final writes: retried until known, fenced by the token ──

def test_a_completion_whose_reply_was_lost_is_recognised_as_done() -> None:
    async def go() -> None:
        async with World(ok) as w:
            jid = w.store.add()
            w.store.lose_reply("complete")
            w.deliver(jid)
            await w.until(lambda: len(w.store.named("complete")) == 2)
            await w.idle()
            assert w.status(jid) == "completed" and w.tally.counters["completed"] == 1
            assert w.tally.counters["lease_lost"] == 0
    run(go())


def test_a_failure_whose_reply_was_lost_is_recognised_as_written() -> None:
    async def go() -> None:
        async with World(boom) as w:
            jid = w.store.add()
            w.store.lose_reply("fail")
            w.deliver(jid)
            await w.until(lambda: len(w.store.named("fail")) == 2)
            await w.idle()
            assert w.status(jid) == "queued" and w.tally.counters["lease_lost"] == 0
    run(go())


def test_a_completion_is_retried_through_errors_until_it_lands() -> None:
    async def go() -> None:
        async with World(ok) as w:
            jid = w.store.add()
            w.store.fail_next("complete", DatabaseUnavailable("a"), RuntimeError("driver bug"))
            w.deliver(jid)
            await w.until(lambda: w.status(jid) == "completed")
            assert len(w.store.named("complete")) == 3
    run(go())


def test_a_completion_after_the_lease_lapsed_does_not_land() -> None:
    async def go() -> None:
        release = asyncio.Event()

        async def waits(job: Job) -> None:
            await release.wait()
        async with World(waits) as w:
            jid = w.store.add()
            w.deliver(jid)
            await w.until(lambda: w.status(jid) == "active")
            w.store.lapse(jid)
            w.store.rows[jid].status = "queued"  # the reaper took it back
            release.set()
            await w.idle()
            assert w.status(jid) == "queued" and w.store.rows[jid].result is None
            assert w.tally.counters["completed"] == 0
    run(go())


# ── renewals, lost leases, self-fencing ──

def test_one_renewal_statement_renews_every_lease() -> None:
    async def go() -> None:
        async def slow(job: Job) -> None:
            await asyncio.sleep(0.25)
        async with World(slow, concurrency=3) as w:
            ids = [w.store.add(lease_s=0.15) for _ in range(3)]
            w.deliver(*ids)
            await w.until(lambda: all(w.status(i) == "completed" for i in ids))
            renewals = w.store.named("renew")
            assert max(len(r) for r in renewals) == 3  # all of them, in one statement
            assert all(w.store.rows[i].attempts == 1 for i in ids)  # none lapsed meanwhile
    run(go())


async def _stopped_by_the_row(change: Callable[[Any], None]) -> World:
    """A 60 s handler whose row ``change`` alters under its run: the World
    once the handler was stopped (cancelled) and everything settled."""
    cancelled = asyncio.Event()

    async def long(job: Job) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
    async with World(long) as w:
        jid = w.store.add(lease_s=0.3)
        w.deliver(jid)
        await w.until(lambda: w.status(jid) == "active")
        change(w.store.rows[jid])
        await w.until(cancelled.is_set)
        await w.idle()
        assert w.store.named("complete") == [] and w.store.named("fail") == []
    return w


def test_a_renewal_that_matches_no_row_stops_the_handler() -> None:
    def reaped(row: Any) -> None:  # reaped and claimed by another
        row.lock = uuid.uuid4()
    w = run(_stopped_by_the_row(reaped))
    (jid,) = w.store.rows
    assert w.store.lost == [(jid, "renewal matched no row: lapsed, reaped or cancelled")]
    assert w.tally.counters["lease_lost"] == 1


def test_a_job_cancelled_under_its_run_is_stopped_and_not_told_as_a_lost_lease() -> None:
    """Issue #50.10: an operator's cancel of a running job was logged as a
    WARNING "lease lost", counted in jobq_leases_lost_total and recorded as
    a lease_lost event beside the history's cancel."""
    def cancelled(row: Any) -> None:  # an operator cancelled it
        row.status = "cancelled"
    w = run(_stopped_by_the_row(cancelled))
    assert w.store.lost == [] and w.tally.counters["lease_lost"] == 0
    assert w.tally.counters["cancelled_running"] == 1


def test_a_worker_that_cannot_renew_fences_itself_before_the_lease_lapses() -> None:
    async def go() -> None:
        stopped_at: list[float] = []

        async def long(job: Job) -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                stopped_at.append(asyncio.get_running_loop().time())
                raise
        async with World(long) as w:
            jid = w.store.add(lease_s=0.4)
            w.store.fail_next("renew", *[DatabaseUnavailable("cut off")] * 100)
            w.deliver(jid)
            await w.until(lambda: bool(stopped_at), within=2)
            # stopped before the database deadline (the claim's, never renewed)
            assert stopped_at[0] < w.store.rows[jid].expires
            assert w.tally.counters["lease_lost"] == 1
            assert w.store.lost[0][1].startswith("lease not renewed in time")  # type: ignore[union-attr]
    run(go())


def test_a_lost_session_cuts_the_trust_to_the_grace() -> None:
    async def go() -> None:
        async with World(forever) as w:
            jid = w.store.add(lease_s=30, grace_s=0.2)
            w.store.fail_next("renew", *[DatabaseUnavailable("session gone")] * 100)
            w.deliver(jid)
            await w.until(lambda: w.status(jid) == "active")
            w.hb.session_lost(asyncio.get_running_loop().time())
            # Trust cut to the 0.2 s grace, not the lease's 30 s: any bound
            # well under the lease tells them apart on a loaded machine.
            await w.until(lambda: w.tally.counters["lease_lost"] == 1, within=10)
    run(go())


def test_a_progress_write_that_matches_no_row_loses_the_lease(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_mod, "MIN_INTERVAL_S", 0.05)

    async def go() -> None:
        async def reports(job: Job) -> None:
            await job.progress({"done": 1})
            w.store.lapse(job.id)
            await asyncio.sleep(0.06)  # past the coalescing interval: the next write goes out
            await job.progress({"done": 2})
        async with World(reports) as w:
            jid = w.store.add()
            w.deliver(jid)
            await w.until(lambda: w.tally.counters["lease_lost"] == 1)
            await w.idle()
            assert w.store.rows[jid].progress == '{"done":1}'
            assert w.store.named("complete") == [] and w.store.named("fail") == []
    run(go())


# ── drain, suspects, child deaths, limited queues ──

def test_the_drain_releases_running_jobs_and_publishes_them() -> None:
    async def go() -> None:
        async with World(forever) as w:
            ids = [w.store.add(), w.store.add()]
            w.deliver(*ids)
            await w.until(lambda: len(w.runs) == 2 and all(r.task for r in w.runs.values()))
            left = w.executor.stop_all(Stop.SHUTDOWN)
            await asyncio.wait(list(w.executor.tasks), timeout=2)
            await w.completer.release(left, "worker shutting down")
            w.executor.forget(left)
            assert sorted(s.id for s in w.store.published) == sorted(ids)
            assert [w.status(i) for i in ids] == ["queued", "queued"] and w.runs == {}
            assert w.tally.counters["released"] == 2
    run(go())


def test_intake_stopped_requeues_what_waits_in_the_inbox() -> None:
    async def go() -> None:
        async with World(ok, concurrency=1) as w:
            w.stop.set()
            msgs = w.deliver(w.store.add(), w.store.add())
            w.intake.wake()
            await w.until(lambda: all(m.settled for m in msgs))
            assert {m.settled for m in msgs} == {"nack"}
    run(go())


def test_a_second_suspect_waits_then_is_handed_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor_mod, "SUSPECT_WAIT_S", 0.05)

    async def go() -> None:
        gate = asyncio.Event()

        async def waits(job: Job) -> None:
            await gate.wait()
        async with World(waits, concurrency=2) as w:
            a, b = w.store.add(suspect=True), w.store.add(suspect=True)
            w.deliver(a)
            await w.until(lambda: w.store.rows[a].isolated)
            w.deliver(b)
            await w.until(lambda: bool(w.store.named("release")))
            assert w.store.named("release")[0][2] is True  # a hand-off
            assert w.status(b) == "queued" and w.store.rows[b].handoffs == 1
            gate.set()
            await w.until(lambda: w.status(a) == "completed")
    run(go())


def test_a_child_death_is_charged_and_the_job_published_again() -> None:
    from jobq.worker.processes import ChildDied

    async def dies(job: Job) -> None:
        raise ChildDied("its child process was killed by SIGKILL")

    async def go() -> None:
        async with World(dies) as w:
            jid = w.store.add()
            w.deliver(jid)
            await w.until(lambda: bool(w.store.published))
            assert w.store.rows[jid].stalls == 1 and w.status(jid) == "queued"
            assert [s.id for s in w.store.published] == [jid]
    run(go())


def test_a_limited_queue_publishes_its_next_parked_job_when_one_ends() -> None:
    from jobq.rows import Spell

    async def go() -> None:
        async with World(ok) as w:
            jid = w.store.add(limited=True)
            parked = Spell(uuid.uuid4(), "q", uuid.uuid4())
            w.store.parked.append(parked)
            w.deliver(jid)
            await w.until(lambda: bool(w.store.published))
            assert w.store.published == [parked]
    run(go())


def test_a_jobq_error_while_running_a_job_is_that_runs_failure_not_a_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #47 H3: a fault of jobq's own while running a job (there, a
    trace record it could not read) released the job, which came straight
    back to the same fault, ~110 times a second, forever. It is now a
    failure of that run: an attempt counted, the backoff, failed at the
    queue's max_attempts."""
    def broken(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("a fault of jobq's own")

    monkeypatch.setattr(tracing_mod, "run_span", broken)

    async def go() -> None:
        async with World(ok) as w:
            jid = w.store.add(max_attempts=2)
            loop = asyncio.get_running_loop()
            for attempt in (1, 2):
                await w.until(lambda: w.store.rows[jid].run_at <= loop.time())  # due again
                w.deliver(jid)
                await w.until(lambda: w.store.rows[jid].attempts == attempt
                              and w.status(jid) != "active")
                await w.idle()
            row = w.store.rows[jid]
            assert (row.status, row.attempts) == ("failed", 2)
            assert "jobq error in the consumer" in (row.error or "")
            assert not w.store.named("release")
    run(go())


def test_a_lease_whose_row_another_transaction_holds_is_tried_again_not_lost() -> None:
    """I11: a renewal never waits for a row lock; a busy lease stays ours
    and is renewed once the row is free."""
    async def go() -> None:
        async with World(forever) as w:
            jid = w.store.add(lease_s=1.0)
            w.deliver(jid)
            await w.until(lambda: w.status(jid) == "active")
            w.store.rows[jid].locked = True
            renewals = len(w.store.named("renew"))
            await w.until(lambda: len(w.store.named("renew")) >= renewals + 2)
            w.store.rows[jid].locked = False
            await w.until(lambda: len(w.store.named("renew")) >= renewals + 4)
            assert w.tally.counters["lease_lost"] == 0 and w.status(jid) == "active"
    run(go())
