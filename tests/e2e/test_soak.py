"""A short soak in the suite: jobs with random durations while consumers are
SIGKILLed and restarted every second and a reaper now and then. The full
soak is ``bench/soak.py --jobs 5000``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.soak import soak

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.heavy  # ~45 server connections: takes turns with the other heavy tests
def test_short_soak_loses_nothing(db_url: str, amqp_url: str, namespace: str, tmp_path: Path,
                                  report: Any) -> None:
    result = soak(db_url, amqp_url, namespace, jobs=600, consumers=3, concurrency=8,
                  lease_s=1.0, kill_every_s=1.0, max_sleep_s=1.0, timeout_s=120,
                  logdir=tmp_path, seed=7)
    assert result["consumer_kills"] >= 3, result
    assert result["lost"] == 0, result
    assert result["reruns"] <= result["in_flight_at_kills"], result
    report("soak: 600 jobs, SIGKILL a consumer every 1 s", result["jobs"], result["lost"],
           result["reruns"])
