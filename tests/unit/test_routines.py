"""How a block of queries.sql becomes a function (routines.py, sql.py)."""

from __future__ import annotations

import pytest

from jobq.routines import plpgsql
from jobq.sql import GENERIC_PLAN, parse


def test_a_block_becomes_a_plpgsql_body_returning_its_last_statement() -> None:
    text = plpgsql("SELECT 1 FROM t FOR UPDATE;\nUPDATE t SET x = 1;\nSELECT 2", True)
    assert text.splitlines()[2:] == ["PERFORM 1 FROM (SELECT 1 FROM t FOR UPDATE) AS _effect;",
                                     "UPDATE t SET x = 1;", "RETURN QUERY SELECT 2;", "END"]


def test_only_a_function_keeps_a_generic_plan() -> None:
    with pytest.raises(ValueError, match="generic plan"):
        parse("-- name: a\n-- plan: generic\nSELECT 1;")
    body, grants, generic = parse(
        "-- name: a\n-- grant: jobq_consumer\n-- plan: generic\nSELECT 1;")
    assert (body, grants, generic) == ({"a": "SELECT 1"}, {"a": ("jobq_consumer",)}, {"a"})
    # the per-job statements of the consumer and the producer's mark
    assert {"claim", "complete", "renew", "fail", "release", "mark_published",
            "mark_republished"} == GENERIC_PLAN
