"""How a block of queries.sql becomes a function (routines.py, sql.py)."""

from __future__ import annotations

import pytest

from jobq.ops.routines import plpgsql
from jobq.sql import GENERIC_PLAN, parse


def test_a_block_becomes_a_plpgsql_body_returning_its_last_statement() -> None:
    text = plpgsql("SELECT 1 FROM t FOR UPDATE;\nUPDATE t SET x = 1;\nSELECT 2", True)
    assert text.splitlines()[2:] == ["PERFORM 1 FROM (SELECT 1 FROM t FOR UPDATE) AS _effect;",
                                     "UPDATE t SET x = 1;", "RETURN QUERY SELECT 2;", "END"]


def test_only_a_function_keeps_a_generic_plan() -> None:
    with pytest.raises(ValueError, match="generic plan"):
        parse("-- name: a\n-- plan: generic\nSELECT 1;")
    body, grants, generic, fast = parse(
        "-- name: a\n-- grant: jobq_consumer\n-- plan: generic\nSELECT 1;")
    assert (body, grants, set(generic), fast) == ({"a": "SELECT 1"}, {"a": ("jobq_consumer",)},
                                                  {"a"}, {})
    # the per-job statements of the consumer and the producer's mark
    assert {"claim", "complete", "renew", "fail", "release", "mark_published",
            "mark_republished"} == GENERIC_PLAN


def test_a_fast_path_runs_alone_when_its_guard_holds() -> None:
    """``-- fast:``: the lean block's guard decides, and then nothing else runs."""
    text = ("-- name: a\n-- grant: jobq_consumer\n-- fast: a_lean\nSELECT 1 FOR UPDATE;\n"
            "SELECT 2;\n-- name: a_lean\nSELECT true;\nSELECT 3;")
    body, _, _, fast = parse(text)
    assert fast == {"a": "a_lean"}
    lines = plpgsql(body["a"], True, body["a_lean"]).splitlines()
    assert lines[2:6] == ["IF (SELECT true) THEN", "RETURN QUERY SELECT 3;", "RETURN;", "END IF;"]
    assert lines[-2:] == ["RETURN QUERY SELECT 2;", "END"]
    with pytest.raises(ValueError, match="fast"):
        parse("-- name: a\n-- grant: jobq_consumer\n-- fast: b\nSELECT 1;\n-- name: b\n"
              "SELECT 3;")
