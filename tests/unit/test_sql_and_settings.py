"""No services needed: the SQL file parses, settings validate."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from jobq.settings import Settings
from jobq.sql import Q, parse


def test_every_statement_is_named_once_and_non_empty() -> None:
    assert {"claim", "renew", "complete", "fail", "release", "requeue_lapsed",
            "relay_take", "mark_published"} <= set(Q)
    assert all(sql.strip() and not sql.rstrip().endswith(";") for sql in Q.values())
    with pytest.raises(ValueError, match="twice"):
        parse("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;")


def test_lease_writes_are_all_fenced() -> None:
    for name in ("renew", "complete", "fail", "release"):
        sql = Q[name]
        assert re.search(r"j\.lock = \w\.lock", sql), name
        assert "j.status COLLATE \"C\" = 'active'" in sql, name
        assert "j.lease_expires_at > now()" in sql, name


def test_settings_reject_bad_urls_and_unknown_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="JOBQ_DATABASE_URL"):
        Settings(database_url="mysql://x")
    with pytest.raises(ValidationError, match="JOBQ_AMQP_URL"):
        Settings(amqp_url="http://x")
    with pytest.raises(ValidationError):
        Settings(consumer={"concurrency": 0})
    with pytest.raises(ValidationError):
        Settings(consumer={"bogus": 1})
    monkeypatch.setenv("JOBQ_CONSUMER__CONCURRENCY", "7")
    assert Settings().consumer.concurrency == 7
