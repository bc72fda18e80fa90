"""No services needed: the SQL file parses, settings validate."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from jobq.settings import Settings
from jobq.sql import BODY, Q, parse


def test_every_statement_is_named_once_and_non_empty() -> None:
    assert {"claim", "renew", "complete", "fail", "release", "requeue_lapsed",
            "relay_take", "mark_published"} <= set(Q)
    assert all(sql.strip() and not sql.rstrip().endswith(";") for sql in Q.values())
    with pytest.raises(ValueError, match="twice"):
        parse("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;")


def test_lease_writes_are_all_fenced() -> None:
    for name in ("renew", "complete", "fail", "release"):
        sql = BODY[name]
        # the token a row was given: joined, or from the array by the id's position
        assert re.search(r"j\.lock = (\w\.lock|\(\$2::uuid\[\]\)\[array_position\("
                         r"\$1::uuid\[\], j\.id\)\])", sql), name
        assert "j.status COLLATE \"C\" = 'active'" in sql, name
        assert "j.lease_expires_at > now()" in sql, name


def test_settings_reject_bad_urls_and_unknown_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="JOBQ_DATABASE_URL"):
        Settings(database_url="mysql://x")
    with pytest.raises(ValidationError, match="JOBQ_AMQP_URL"):
        Settings(amqp_url="http://x")
    with pytest.raises(ValidationError):
        Settings.model_validate({"consumer": {"concurrency": 0}})
    with pytest.raises(ValidationError):
        Settings.model_validate({"consumer": {"bogus": 1}})
    monkeypatch.setenv("JOBQ_CONSUMER__CONCURRENCY", "7")
    assert Settings().consumer.concurrency == 7


def test_granted_statements_become_calls_of_their_function() -> None:
    body, grants, _, _ = parse("-- name: a\n-- grant: jobq_consumer, jobq_producer\n"
                         "SELECT $1::int + $3::int, $2::text;\n-- name: b\nSELECT 1;")
    assert grants == {"a": ("jobq_consumer", "jobq_producer")} and "grant" not in body["a"]
    from jobq.sql import call

    assert call("a", body["a"]) == "SELECT * FROM jobq.q_a($1, $2, $3)"
    assert Q["claim"].startswith("SELECT * FROM jobq.q_claim(") and "UPDATE" in BODY["claim"]
    assert Q["requeue_lapsed"] == BODY["requeue_lapsed"]  # the reaper's: plain table rights
    with pytest.raises(ValueError, match="grant"):
        parse("-- name: a\n-- grant: postgres\nSELECT 1;")
