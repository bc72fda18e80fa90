"""Crash points for fault-injection tests.

``JOBQ_CRASH_AT=consumer.after_claim`` makes the process SIGKILL itself the
first time it reaches that point (``name:N`` for the N-th time). Unset in
production, where :func:`point` costs one string comparison. Names:

- ``producer.after_commit``   row committed, id not yet published
- ``consumer.before_claim``   message received, claim not yet sent
- ``consumer.after_claim``    claim committed, message not yet acked
- ``consumer.after_handler``  handler returned (side effect done), not completed
- ``reaper.after_requeue``    lapsed leases requeued, ids not yet published
- ``reaper.mid_relay``        relay rows locked and published, not yet marked
"""

from __future__ import annotations

import os
import signal

_target = ""
_nth = 1
_hits = 0


def configure(spec: str) -> None:
    global _target, _nth, _hits
    name, _, n = spec.partition(":")
    _target, _nth, _hits = name.strip(), int(n) if n else 1, 0


def point(name: str) -> None:
    global _hits
    if name != _target:
        return
    _hits += 1
    if _hits == _nth:
        os.kill(os.getpid(), signal.SIGKILL)
