"""The statements a role may run without rights on the tables they touch.

A producer must enqueue and mark its own publishes without reading other
jobs' payloads; a consumer must claim, renew and finish without being able to
change a job it does not hold. Table rights cannot say that (an UPDATE whose
WHERE tests ``lock`` needs SELECT on ``lock``, and then any token can be
read), so such a statement runs as a SECURITY DEFINER function owned by the
schema's owner: its text is the fence. Each is generated from its block in
queries.sql (``-- grant:``), so the statement exists once; parameter and
result types come from the server's own description of the prepared
statement. ``install`` (re)creates the set only when it changed, inside
``jobq migrate``; EXECUTE is revoked from PUBLIC and granted to the listed
roles only; ``search_path`` is pinned so a caller cannot plant look-alike
objects (every name in queries.sql is schema-qualified anyway).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from jobq import roles
from jobq.db import execute, fetch, fetchrow, fetchval, prepare
from jobq.sql import (
    BODY,
    FAST,
    GENERIC_PLAN,
    GRANTS,
    OPTIONAL,
    Q,
    arity,
    function_name,
    statements,
)

log = logging.getLogger("jobq.ops.migrate")

PINNED_PATH = "pg_catalog, pg_temp"
# Part of every checksum: a change to how functions are generated (not only
# to their statements) makes migrate recreate them.
GENERATOR = "plpgsql/3"
# Plan every call for its arguments, whatever the session says: a generic
# plan cached while jobq.job was small keeps sequential scans (db.py's
# SESSION_SETTINGS say the same at login, which PgBouncer does not pass on).
PLAN_SETTING = "SET plan_cache_mode = force_custom_plan"
# ``-- plan: generic`` (the consumer's and producer's per-job statements):
# planned once per session, not per call, which cost more than running them
# (issue #16, bench/claim_cost.py: a one-job claim 0.87 -> 0.34 ms of server
# CPU, a completion 0.41 -> 0.23). Safe only for a statement whose rows are named by id and
# whose status tests are written ``status COLLATE "C" = ...``, so that no
# partial index of jobq.job can serve it: with sequential scans priced out
# the primary key is then the only plan there is, whatever the statistics
# were when the plan was made (tests/integration/test_plans.py checks it).
GENERIC_SETTING = "SET plan_cache_mode = force_generic_plan SET enable_seqscan = off"


async def _types(conn: Any, oids: list[int]) -> list[str]:
    rows = await fetch(conn, Q["type_names"], oids)
    return [r["t"] for r in rows]


async def definition(conn: Any, name: str, prefix: str = roles.DEFAULT) -> tuple[str, str]:
    """(argument types, CREATE FUNCTION text) for one granted statement, with
    the install's role names (roles.py)."""
    body = roles.rename(BODY[name], prefix)
    stmt = await prepare(conn, statements(body)[-1])  # the last one's result is returned
    params = await _types(conn, [p.oid for p in stmt.get_parameters()])
    if len(params) != arity(body):
        raise ValueError(f"queries.sql: {name}: parameters must be numbered $1..$n without gaps")
    cols = stmt.get_attributes()
    args = ", ".join(params)
    first_optional = OPTIONAL.get(name, len(params) + 1)
    declared = ", ".join(f"{t} DEFAULT NULL" if i >= first_optional else t
                         for i, t in enumerate(params, 1))
    if cols:
        names = [a.name for a in cols]
        if len(set(names)) != len(names):
            raise ValueError(f"queries.sql: {name}: result columns must have distinct names")
        types = await _types(conn, [a.type.oid for a in cols])
        returns = "TABLE(" + ", ".join(
            f'"{n}" {t}' for n, t in zip(names, types)) + ")"
    else:
        returns = "void"
    if "$jobq$" in body:
        raise ValueError(f"queries.sql: {name}: the text $jobq$ is reserved")
    create = (f"CREATE FUNCTION {function_name(name)}({declared}) RETURNS {returns}\n"
              f"LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = {PINNED_PATH}\n"
              f"{GENERIC_SETTING if name in GENERIC_PLAN else PLAN_SETTING}\n"
              f"AS $jobq$\n{plpgsql(body, bool(cols), lean_path(name, prefix))}\n$jobq$")
    return args, create


def lean_path(name: str, prefix: str = roles.DEFAULT) -> str | None:
    """The block of a statement's ``-- fast:`` path (sql.py), if it has one."""
    return roles.rename(BODY[FAST[name]], prefix) if name in FAST else None


def plpgsql(body: str, returns_rows: bool, fast: str | None = None) -> str:
    """The statements as a PL/pgSQL body. PL/pgSQL, not SQL: it keeps each
    statement parsed and analysed for the session, where a SQL function
    called from a new query re-parses its body on every call (measured: the
    producer's mark cost 0.53 ms of server CPU as a SQL function, ~0.40 as
    PL/pgSQL, 0.36 ms as the bare statement); whether each call is also
    planned for its arguments is the function's plan setting (above).
    Columns win over the output names (``use_column``), so the text means
    what it means as a statement; an earlier SELECT is run for its effect
    (its row locks) via PERFORM."""
    parts = statements(body)
    out = ["#variable_conflict use_column", "BEGIN"]
    if fast is not None:  # sql.py: a guard, then the lean statement
        guard, lean = statements(fast)
        out += [f"IF ({guard}) THEN", f"RETURN QUERY {lean};" if returns_rows else f"{lean};",
                "RETURN;", "END IF;"]
    for i, stmt in enumerate(parts):
        last = i == len(parts) - 1
        if last and returns_rows:
            out.append(f"RETURN QUERY {stmt};")
        elif stmt.lstrip()[:6].upper() == "SELECT":
            out.append(f"PERFORM 1 FROM ({stmt}) AS _effect;")
        else:
            out.append(f"{stmt};")
    out.append("END")
    return "\n".join(out)


def checksums(schema_version: int, prefix: str = roles.DEFAULT) -> dict[str, str]:
    """What each function is made from: its statement, its roles, and the
    schema it was typed against (a migration can change a column's type)."""
    return {name: hashlib.sha256(
                f"{GENERATOR}\n{BODY[name]}\n{lean_path(name)}\n{OPTIONAL.get(name)}\n{','.join(granted)}\n"
                f"{schema_version}{' generic' if name in GENERIC_PLAN else ''}"
                f"{'' if prefix == roles.DEFAULT else ' ' + prefix}".encode())
            .hexdigest() for name, granted in GRANTS.items()}


async def _installed(conn: Any) -> dict[str, str] | None:
    if await fetchval(conn, Q["routines_present"]) is None:
        return None
    return {r["name"]: r["checksum"] for r in await fetch(conn, Q["routines_installed"])}


async def stale(conn: Any, schema_version: int, prefix: str = roles.DEFAULT) -> bool:
    """Whether install() has anything to do (read-only, no rights needed
    beyond reading jobq.schema_routine)."""
    return await _installed(conn) != checksums(schema_version, prefix)


async def install(conn: Any, schema_version: int, prefix: str = roles.DEFAULT) -> list[str]:
    """Make jobq.q_* match queries.sql; returns the names (re)created or
    dropped. Runs inside migrate's transaction, after the migrations."""
    await execute(conn, Q["routines_create"])
    have = await _installed(conn) or {}
    changed: list[str] = []
    for name, checksum in sorted(checksums(schema_version, prefix).items()):
        if have.pop(name, None) == checksum:
            continue
        args, create = await definition(conn, name, prefix)
        fn = function_name(name)
        # DROP, not CREATE OR REPLACE: a changed result type cannot be replaced.
        await execute(conn, await fetchval(conn, Q["routine_drop_statement"], fn))
        await execute(conn, create)  # queries.sql's statement, wrapped by definition()
        rights = await fetchrow(conn, Q["routine_grant_statements"], fn, args,
                                [roles.rename(r, prefix) for r in GRANTS[name]])
        assert rights is not None
        await execute(conn, rights["revoke"])
        await execute(conn, rights["grant"])
        await execute(conn, Q["routine_record"], name, checksum)
        changed.append(name)
    for gone in have:  # a statement no longer granted
        await execute(conn, await fetchval(conn, Q["routine_drop_statement"],
                                           function_name(gone)))
        await execute(conn, Q["routine_forget"], gone)
        changed.append(gone)
    if changed:
        log.info("installed %d statement function(s): %s", len(changed), ", ".join(changed))
    return changed
