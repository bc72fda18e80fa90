"""One options type (issue #48): the batch statement's arrays are named in
the order newjob.COLUMNS fills them, and so are the single-job statement's;
adding an option is one field, one COLUMNS entry and one migration."""

from __future__ import annotations

import re
import uuid

from jobq.newjob import COLUMNS, NewJob, arrays, new_job
from jobq.sql import BODY

NAMES = {"queues": "queue", "payloads": "payload", "delays_s": "delay_s",
         "idempotency_keys": "idempotency_key", "priorities": "priority", "keys": "key",
         "debounces_s": "debounce_s"}  # jobq.enqueue_many's array -> jobq.enqueue's argument


def _named(statement: str) -> list[tuple[str, int]]:
    return [(name, int(n)) for name, n in re.findall(r"(\w+) => \$(\d+)", statement)]


def test_the_batch_statements_take_the_arrays_in_the_order_of_columns() -> None:
    for name in ("enqueue_many", "enqueue_many_traced"):
        named = _named(BODY[name])
        assert named[:len(COLUMNS)] == [(c, i + 1) for i, (c, _) in enumerate(COLUMNS)], name


def test_the_single_job_statement_takes_the_options_in_the_order_of_columns() -> None:
    named = _named(BODY["enqueue_linked"])
    assert named[:len(COLUMNS)] == [(NAMES[c], i + 1) for i, (c, _) in enumerate(COLUMNS)]


def test_arrays_carry_each_option_of_each_job() -> None:
    parent = uuid.uuid4()
    jobs = [NewJob("a", {}), new_job("b", [1], {"priority": 7, "key": "k", "delay_s": -3,
                                                 "after": iter([parent])})]
    got = dict(zip((c for c, _ in COLUMNS), arrays(jobs, ["{}", "[1]"])))
    assert got == {"queues": ["a", "b"], "payloads": ["{}", "[1]"], "delays_s": [0.0, 0.0],
                   "idempotency_keys": [None, None], "priorities": [0, 7],
                   "keys": [None, "k"], "debounces_s": [0.0, 0.0]}
    assert jobs[1].after == (parent,)  # any iterable, kept as a tuple
