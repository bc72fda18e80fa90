"""A consumer's four units, built in one place and in one order.

The executor owns the runs (it adds one at the claim and removes it at its
end); the heartbeat is handed a read-only view of them when the executor is
built, the completer and the executor share the heartbeat (a rejected write
loses the lease there), and the intake starts jobs through the executor.
``Consumer`` and the unit tests' ``World`` both build them here, so the wiring
they test is the wiring that runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from jobq.handlers import Handlers
from jobq.settings import ConsumerSettings
from jobq.worker.completer import Completer
from jobq.worker.executor import Executor
from jobq.worker.handback import Publish
from jobq.worker.heartbeat import Heartbeat
from jobq.worker.intake import Intake
from jobq.worker.processes import ProcessPool
from jobq.worker.store import WorkerStore
from jobq.worker.tally import Tally


@dataclass(frozen=True)
class Units:
    heartbeat: Heartbeat
    completer: Completer
    executor: Executor
    intake: Intake


def assemble(app: Handlers, cfg: ConsumerSettings, store: WorkerStore, *, worker_id: str,
             queues: list[str], concurrency: int, tally: Tally, stop: asyncio.Event,
             processes: ProcessPool | None = None,
             on_claimed: Callable[[], None] | None = None,
             hand_back: Publish | None = None) -> Units:
    slots = asyncio.Semaphore(concurrency)  # a delivery waits for one before its claim
    heartbeat = Heartbeat(cfg, worker_id, tally, store)
    completer = Completer(store, heartbeat, tally, worker_id)
    executor = Executor(app, cfg, concurrency, worker_id, store, heartbeat, completer, tally,
                        slots, processes)
    intake = Intake(store, queues, slots, stop, tally, executor.start, on_claimed, hand_back)
    return Units(heartbeat, completer, executor, intake)
