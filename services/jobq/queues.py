"""Per-queue settings, stated once: column, CLI flag, type, finite bounds,
default and meaning. The ``jobq queue set`` flags are built from this list,
values are checked against it before they reach the database, and tests hold
the schema's columns and CHECK bounds, ``queue_update`` in ``queries.sql``
and the README's table to it. The bounds are also CHECK constraints in
``schema/0003_bounded_queues.sql``: NaN, Infinity and absurd values never
reach a claim, where they made every claim of the queue fail."""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from jobq.errors import InvalidQueue

# issue #51, schema 0027: the first is today's behaviour, the default
KEY_POLICIES = ("queue", "fifo", "latest", "singleton")


@dataclass(frozen=True)
class Setting:
    column: str
    flag: str
    kind: type
    lo: float
    hi: float
    default: Any
    help: str
    lo_open: bool = False  # lo itself is not allowed
    zero_is_none: bool = False  # 0 on the CLI means "no value" (timeout_s)
    aliases: tuple[str, ...] = ()  # other spellings of the flag
    choices: tuple[str, ...] = ()  # the words a text setting takes (kind str)

    def parse(self, text: str) -> Any:
        """A CLI value, checked; raises ArgumentTypeError with one line."""
        if self.kind is str:
            if text not in self.choices:
                raise argparse.ArgumentTypeError(
                    f"expected one of {', '.join(self.choices)}, got {text!r}")
            return text
        if self.kind is bool:
            low = text.lower()
            if low in ("on", "true", "yes", "1"):
                return True
            if low in ("off", "false", "no", "0"):
                return False
            raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
        try:
            value = int(text) if self.kind is int else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'a whole number' if self.kind is int else 'a number'}, "
                f"got {text!r}") from None
        if self.zero_is_none and value == 0:
            return 0
        if not math.isfinite(value) or value > self.hi or value < self.lo or (
                self.lo_open and value == self.lo):
            low = f"over {_num(self.lo)}" if self.lo_open else f"at least {_num(self.lo)}"
            raise argparse.ArgumentTypeError(
                f"must be {low} and at most {_num(self.hi)}, got {text}")
        return value


def _num(x: float) -> str:
    return f"{int(x):,}" if x == int(x) else f"{x:g}"


SETTINGS: tuple[Setting, ...] = (
    Setting("lease_s", "--lease-seconds", float, 0.5, 86400, 30.0,
            "lease length; renewed every third of it"),
    Setting("max_stalls", "--max-stalls", int, 0, 10000, 3,
            "crashes charged to a job before it fails as a job of death"),
    Setting("max_attempts", "--max-attempts", int, 1, 10000, 5,
            "handler runs before a failing job is failed"),
    Setting("timeout_s", "--timeout-seconds", float, 0, 604800, None,
            "stop a handler that runs longer (0 = no timeout)", lo_open=True, zero_is_none=True),
    Setting("backoff_base_s", "--backoff-seconds", float, 0, 86400, 1.0,
            "first retry delay; doubles each attempt"),
    Setting("backoff_max_s", "--backoff-max-seconds", float, 0, 2592000, 300.0,
            "cap of retry delay and stall cool-down"),
    Setting("stall_cooldown_s", "--stall-cooldown-seconds", float, 0, 86400, 5.0,
            "wait before rerunning a job charged a 2nd, 3rd... stall; doubles each time"),
    Setting("max_payload_bytes", "--max-payload-bytes", int, 1, 104857600, 1048576,
            "largest payload accepted at enqueue"),
    Setting("vanished_grace_s", "--vanished-grace-seconds", float, 0, 3600, 2.0,
            "how short a reaper cuts the leases of a worker whose session ended",
            lo_open=True),
    Setting("keep_completed_s", "--keep-completed-seconds", float, 60, 315360000, 86400.0,
            "reapers delete completed jobs this long after they finished (0 = keep)",
            zero_is_none=True),
    Setting("keep_failed_s", "--keep-failed-seconds", float, 60, 315360000, 604800.0,
            "the same for failed and cancelled jobs (0 = keep)", zero_is_none=True),
    Setting("history", "--history", bool, 0, 1, True,
            "on/off: record in jobq.job_event the transitions the row does not keep"),
    Setting("max_result_bytes", "--max-result-bytes", int, 0, 104857600, 65536,
            "largest handler result stored; a larger one fails the job"),
    Setting("max_running", "--max-running", int, 1, 1000000, None,
            "at most this many jobs of the queue run at once, fleet-wide (0 = no limit)",
            zero_is_none=True),
    Setting("rate_per_s", "--rate-per-second", float, 0, 100000, None,
            "at most this many starts per second, fleet-wide (0 = no limit)",
            lo_open=True, zero_is_none=True, aliases=("--rate-limit",)),
    Setting("max_running_per_key", "--max-running-per-key", int, 1, 1000000, None,
            "at most this many jobs of one key run at once, fleet-wide; keys share the "
            "queue fairly (0 = no limit)", zero_is_none=True),
    Setting("rate_per_s_per_key", "--rate-per-second-per-key", float, 0, 100000, None,
            "at most this many starts per second for each key (0 = no limit)",
            lo_open=True, zero_is_none=True),
    Setting("key_policy", "--key-policy", str, 0, 0, "queue",
            "what a keyed job meets when its key already has work: queue (fair across keys), "
            "fifo (one at a time in publish order), latest (a newer job cancels the older), "
            "singleton (a publish while the key has a live job returns that job's id)",
            choices=KEY_POLICIES),
    Setting("priority_aging_s", "--priority-aging-s", float, 1, 604800, None,
            "a waiting job gains a priority level every this many seconds it has been due: "
            "a priority-p job is ordered as a 9 published (9 - p) times this later, so a "
            "flood of high jobs cannot hold a low one forever (0 = no aging)",
            zero_is_none=True),
    Setting("halt_on_failure", "--halt-on-failure", bool, 0, 1, False,
            "on/off, fifo queues: a key whose job failed starts nothing after it until "
            "`jobq retry` of that job"),
)

BY_COLUMN = {s.column: s for s in SETTINGS}


def changes(values: dict[str, Any]) -> str:
    """The settings to change, as the JSON object ``queue_update`` takes
    (only the given ones; timeout_s = 0 removes the timeout)."""
    out = {}
    for column, value in values.items():
        if value is None:
            continue
        if column not in BY_COLUMN:
            raise KeyError(column)
        out[column] = value
    return json.dumps(out)


QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")  # whole name: fullmatch
# Names jobq itself uses on the broker: <namespace>.dead is the dead-letter
# queue, and a job queue of that name made every relay sweep fail.
RESERVED_QUEUES = frozenset({"dead"})


def check_queue_name(name: object) -> str:
    """The name, if it can be a job queue; InvalidQueue (one line) if not."""
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise InvalidQueue(f"invalid queue name {name!r}: use 1-100 letters, digits, _ . : - "
                           "(first a letter or digit)")
    if name in RESERVED_QUEUES:
        raise InvalidQueue(f"queue name {name!r} is reserved (jobq's dead-letter queue); "
                           "choose another name")
    return name
