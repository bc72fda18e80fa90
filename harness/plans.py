"""A statement's plan as its function makes it (tests/integration/test_plans.py,
test_batch_work.py): prepared with the function's parameter types and its
``-- plan: generic`` settings, then EXPLAINed with the arguments written out
(EXPLAIN EXECUTE takes no parameters), all in a transaction rolled back."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from jobq.ops.routines import GENERIC_SETTING, definition


def literal(value: Any) -> str:
    """SQL text for an argument."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(literal(v) for v in value) + "]"
    return "'" + str(value).replace("'", "''") + "'"


async def explain_generic(conn: asyncpg.Connection, name: str, stmt: str,
                          args: tuple[Any, ...], analyze: bool = False) -> Any:
    """The JSON plan of ``stmt``, a statement of function ``name``, planned
    as the function plans it; with ``analyze`` it runs (and is rolled back)."""
    types, _ = await definition(conn, name)
    tx = conn.transaction()
    await tx.start()
    try:
        for setting in GENERIC_SETTING.split("SET ")[1:]:
            await conn.execute(f"SET LOCAL {setting}")
        await conn.execute(f"PREPARE as_generic ({types}) AS {stmt}")
        params = ", ".join(f"{literal(a)}::{t}" for a, t in zip(args, types.split(", ")))
        raw = await conn.fetchval(f"EXPLAIN ({'ANALYZE, ' if analyze else ''}FORMAT JSON) "
                                  f"EXECUTE as_generic ({params})")
        return json.loads(raw) if isinstance(raw, str) else raw
    finally:
        await tx.rollback()
        await conn.execute("DEALLOCATE as_generic")  # a PREPARE outlives its transaction
