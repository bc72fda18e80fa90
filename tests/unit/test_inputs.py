"""Input checks that need no services: queue names, per-queue settings and
what the client refuses before anything crosses the wire (issue #13)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from jobq.app import check_queue_name
from jobq.errors import InvalidPayload, InvalidQueue
from jobq.newjob import NewJob, validate
from jobq.queues import BY_COLUMN, SETTINGS
from jobq.sql import Q

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["dead", "abc\n", "", "-x", "a" * 101, "a b", None, 7])
def test_bad_queue_names_are_refused(name: object) -> None:
    with pytest.raises(InvalidQueue):
        check_queue_name(name)


def test_good_queue_names_pass() -> None:
    for name in ("emails", "a", "Q.1:x-y_z", "dead2", "a" * 100):
        assert check_queue_name(name) == name


@pytest.mark.parametrize(("column", "text"), [
    ("lease_s", "nan"), ("lease_s", "inf"), ("lease_s", "1e14"), ("lease_s", "-1"),
    ("lease_s", "0.4"), ("max_payload_bytes", "99999999999"), ("max_stalls", "1.5"),
    ("timeout_s", "-3"), ("vanished_grace_s", "0"), ("history", "maybe"),
    ("key_policy", "newest"), ("key_policy", ""),
])
def test_out_of_range_settings_get_one_line(column: str, text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        BY_COLUMN[column].parse(text)
    assert "\n" not in str(info.value)


def test_settings_in_range_parse() -> None:
    assert BY_COLUMN["lease_s"].parse("60") == 60.0
    assert BY_COLUMN["timeout_s"].parse("0") == 0  # removes the timeout
    assert BY_COLUMN["history"].parse("off") is False
    assert BY_COLUMN["max_stalls"].parse("0") == 0


def test_every_setting_is_in_the_update_statement_and_the_docs() -> None:
    """One list of settings: the SQL and the operating guide's table must name them all."""
    update = Q["queue_update"]
    readme = (ROOT / "docs" / "how-to" / "operating.md").read_text()
    for s in SETTINGS:
        assert re.search(rf"\b{s.column} = ", update), s.column
        assert f"`{s.column}`" in readme, s.column
        assert s.flag in readme or s.column in readme


def test_schema_bounds_match_the_settings() -> None:
    schema = "\n".join(p.read_text() for p in sorted((ROOT / "schema").glob("*.sql")))
    for s in SETTINGS:
        if s.kind in (bool, str):
            continue
        hi = int(s.hi) if s.hi == int(s.hi) else s.hi
        assert re.search(rf"{s.column}\b[^;\n]*\b{hi}\b", schema), s.column


@pytest.mark.parametrize("job", [
    NewJob("q", {}, delay_s=float("nan")), NewJob("q", {}, delay_s=float("inf")),
    NewJob("q", {}, delay_s=1e300), NewJob("q", {}, idempotency_key="k" * 201),
    NewJob("q", {"x": float("nan")}), NewJob("q", {"k\x00": 1}),
], ids=["nan-delay", "inf-delay", "huge-delay", "long-key", "nan-payload", "nul-in-payload"])
def test_the_client_refuses_what_the_database_would(job: NewJob) -> None:
    with pytest.raises(InvalidPayload):
        validate(job)


def test_deep_payloads_are_refused_before_they_are_sent() -> None:
    deep: list[object] = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(InvalidPayload, match="RecursionError"):
        validate(NewJob("q", deep))
    with pytest.raises(InvalidPayload, match="byte limit"):
        validate(NewJob("q", {"blob": "x" * (100 * 1024 * 1024 + 1)}))


def test_a_consumer_refuses_queues_its_app_has_no_handler_for() -> None:
    from harness import apps
    from jobq.settings import Settings
    from jobq.worker.consumer import Consumer

    with pytest.raises(Exception, match="no handler registered for queue"):
        Consumer(apps.app, Settings(), ["nope"])
    with pytest.raises(Exception, match="--pool process needs the app"):
        Consumer(apps.app, Settings.model_validate({"consumer": {"pool": "process"}}), ["proc"])


def test_every_verb_says_what_it_does_and_every_flag_has_help() -> None:
    """Issue #33: several subcommands had no help text."""
    import argparse

    from jobq.ops.cli import parser

    def walk(p: argparse.ArgumentParser, path: str) -> list[str]:
        missing = [] if p.description else [f"{path}: no description"]
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    missing += walk(sub, f"{path} {name}")
            elif action.option_strings and not action.help and action.dest != "help":
                missing.append(f"{path} {action.option_strings[0]}: no help")
        return missing

    assert walk(parser(), "jobq") == []
