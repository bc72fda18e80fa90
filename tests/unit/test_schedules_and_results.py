"""No services: slot arithmetic of schedules (intervals, cron in a time zone
across DST), what a result or a progress value may be, the chart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import BaseModel

from jobq import App
from jobq.client.results import ResultInvalid, encode
from jobq.dashboard.charts import per_queue, sparkline
from jobq.errors import BadInput, ConfigError
from jobq.schedules import Schedule
from jobq.worker.progress import _encode as progress_json

UTC = UTC


def test_interval_slots_stay_on_their_grid() -> None:
    s = Schedule("s", "q", every_s=10)
    anchor = datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)
    assert s.next_after(anchor, anchor) == anchor + timedelta(seconds=10)
    late = anchor + timedelta(seconds=95.5)  # a long outage: one slot after now, on the grid
    assert s.next_after(late, anchor) == anchor + timedelta(seconds=100)


def test_cron_slots_follow_the_time_zone_across_dst() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    s = Schedule("s", "q", cron="30 2 * * *", timezone="Europe/Berlin")
    # 2026-03-29 has no 02:30 in Berlin (02:00 -> 03:00): that slot runs at 03:00
    first = s.next_after(datetime(2026, 3, 28, 12, 0, tzinfo=UTC))
    assert first.astimezone(berlin) == datetime(2026, 3, 29, 3, 0, tzinfo=berlin)
    second = s.next_after(first)
    assert second.astimezone(berlin) == datetime(2026, 3, 30, 2, 30, tzinfo=berlin)
    assert (second - first) == timedelta(hours=23, minutes=30)  # local time, not UTC


@pytest.mark.parametrize(("kw", "msg"), [
    ({"cron": "61 * * * *"}, "bad cron"),
    ({"every_s": 0.5}, "interval"),
    ({"cron": "* * * * *", "every_s": 5}, "not both"),
    ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "time zone"),
])
def test_bad_schedules_are_one_line(kw: dict[str, Any], msg: str) -> None:
    with pytest.raises(BadInput, match=msg):
        Schedule("s", "q", **kw)


def test_periodic_goes_above_a_handler() -> None:
    app = App()

    @app.periodic(every=60)
    @app.handler("beats")
    async def beat(job: object) -> None: ...

    assert app.schedules["beats"].every_s == 60
    with pytest.raises(ConfigError, match=r"above @app\.handler"):
        app.periodic(every=60)(lambda job: None)


class Answer(BaseModel):
    n: int


def test_results_are_json_within_the_limit() -> None:
    assert encode(None, 10) is None
    assert encode({"a": [1, 2]}, 100) == '{"a":[1,2]}'
    assert encode(Answer(n=3), 100) == '{"n":3}'
    with pytest.raises(ResultInvalid, match="not JSON"):
        encode(object(), 100)
    with pytest.raises(ResultInvalid, match="not JSON"):
        encode(float("nan"), 100)
    with pytest.raises(ResultInvalid, match="over the queue's max_result_bytes of 5"):
        encode("a long string", 5)


def test_progress_is_a_number_or_a_small_object() -> None:
    assert progress_json(42) == "42" and progress_json({"done": 1}) == '{"done":1}'
    for bad in ("text", True, [1], {"x": "y" * 5000}, float("inf")):
        with pytest.raises(BadInput):
            progress_json(bad)


def test_the_chart_puts_this_minute_on_the_right() -> None:
    series = per_queue([{"queue": "a", "minutes_ago": 0, "n": 5},
                        {"queue": "a", "minutes_ago": 59, "n": 1}])
    assert series["a"][0] == 5 and series["a"][59] == 1 and len(series["a"]) == 60
    svg = sparkline(series["a"])
    assert svg.startswith("<svg") and "max 5" in svg and "<script" not in svg
    assert sparkline([]) == ""
