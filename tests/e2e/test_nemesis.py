"""The randomized fault schedule, short (issue #36): bench/nemesis.py for
20 s with a random seed, printed so a failure can be replayed with
`bench/nemesis.py --seed N`. Nothing lost, nothing completed by a non-owner
or twice, every published id in the database."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import nemesis

pytestmark = pytest.mark.e2e


def test_a_random_fault_schedule_loses_nothing() -> None:
    seed = random.randrange(1_000_000)
    print(f"\nnemesis seed {seed} (replay: .venv/bin/python bench/nemesis.py --seconds 20 "
          f"--seed {seed})")
    report = nemesis.run(20, seed, consumers=3, reapers=2)
    print(report)
    assert report["jobs"] > 100 and report["published_ids_returned"] > 100, report
    bad = {k: report[k] for k in ("lost", "not_in_db", "completed_by_non_owner",
                                  "completed_twice")}
    assert bad == dict.fromkeys(bad, 0), (seed, report)
