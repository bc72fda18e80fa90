"""How a block of queries.sql becomes a function body (routines.plpgsql)."""

from __future__ import annotations

import pytest

from jobq.routines import plpgsql
from jobq.sql import BODY, IF_FOUND, parse, statements


def test_a_statement_marked_if_found_answers_instead_of_the_rest() -> None:
    body = f"SELECT 1 FROM t FOR UPDATE;\n{IF_FOUND}\nSELECT 3;\nSELECT 2"
    text = plpgsql(body, True)
    assert "PERFORM 1 FROM (SELECT 1 FROM t FOR UPDATE) AS _effect;" in text
    assert f"IF FOUND THEN\nRETURN QUERY {IF_FOUND}\nSELECT 3;\nRETURN;\nEND IF;" in text
    assert text.rstrip().endswith("RETURN QUERY SELECT 2;\nEND")
    assert f"IF FOUND THEN\n{IF_FOUND}\nUPDATE t SET x = 1;\nRETURN;\nEND IF;" in plpgsql(
        f"SELECT 1 FROM t;\n{IF_FOUND}\nUPDATE t SET x = 1;\nUPDATE t SET x = 2", False)
    with pytest.raises(ValueError, match="before it"):
        plpgsql(f"{IF_FOUND}\nSELECT 1", True)


def test_the_claim_with_limits_runs_only_when_a_queue_of_its_batch_is_limited() -> None:
    parts = statements(BODY["claim"])
    assert len(parts) == 3 and parts[1].startswith(IF_FOUND)
    assert "FOR NO KEY UPDATE" in parts[0] and "parked AS" in parts[1]
    assert "allowance" not in parts[2]
    assert all("relay_after < 'infinity'" in p for p in parts[1:])  # never a parked row


def test_only_a_function_keeps_a_generic_plan() -> None:
    with pytest.raises(ValueError, match="generic plan"):
        parse("-- name: a\n-- plan: generic\nSELECT 1;")
    body, grants = parse("-- name: a\n-- grant: jobq_consumer\n-- plan: generic\nSELECT 1;")
    assert grants == {"a": ("jobq_consumer",)} and body == {"a": "SELECT 1"}
