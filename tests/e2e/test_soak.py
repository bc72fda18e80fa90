"""A short soak in the suite: jobs with random durations while consumers are
SIGKILLed and restarted every second and a reaper now and then. The full
soak is ``bench/soak.py --jobs 5000``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def load_soak():
    path = Path(__file__).resolve().parents[2] / "bench" / "soak.py"
    spec = importlib.util.spec_from_file_location("jobq_bench_soak", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_short_soak_loses_nothing(db_url, amqp_url, namespace, tmp_path, report):
    result = load_soak().soak(db_url, amqp_url, namespace, jobs=600, consumers=3,
                              concurrency=8, lease_s=1.0, kill_every_s=1.0, max_sleep_s=1.0,
                              timeout_s=120, logdir=tmp_path, seed=7)
    assert result["consumer_kills"] >= 3, result
    assert result["lost"] == 0, result
    assert result["reruns"] <= result["in_flight_at_kills"], result
    report("soak: 600 jobs, SIGKILL a consumer every 1 s", result["jobs"], result["lost"],
           result["reruns"])
