"""Structure checks anyone can run (issues #29, #48): the package's imports
form no circle, counting imports inside functions and under TYPE_CHECKING (a
circle hidden there is still a circle); at most 20 modules sit directly in
services/jobq, every other one in a wing named for its role; no module is
over 300 lines, no function over 60."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "services" / "jobq"
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, name: str, known: set[str]) -> set[str]:
    """Every module of the package this one imports, anywhere in it: at
    module level, in a function, under TYPE_CHECKING."""
    out: set[str] = set()
    for sub in ast.walk(tree):
        if isinstance(sub, ast.Import):
            out |= {a.name for a in sub.names}
        elif isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
            out.add(sub.module)
            out |= {f"{sub.module}.{a.name}" for a in sub.names}
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _imports(ast.parse(p.read_text()), name, set(files))
            for name, p in files.items()}


def test_module_level_imports_form_no_circle() -> None:
    g = graph()
    # A package's __init__ importing its own modules is how Python packages
    # work; what is checked is the circles among the modules themselves.
    g = {k: {m for m in v if k != "jobq" and not (k.startswith("jobq.") and m == "jobq")}
         for k, v in g.items()}
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(g.get(node, ())):
            if state.get(nxt) == 1:
                circles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for start in sorted(g):
        if start not in state:
            visit(start, [start])
    assert circles == [], " ; ".join(" -> ".join(c) for c in circles)


# The core (issue #48): what every wing uses. Every other module lives in a
# wing whose name says its role: client/, worker/, reaper/, ops/, amqp/,
# runtime/, telemetry/, dashboard/, contrib/ (frameworks: Django, issue #50).
MAX_TOP_LEVEL = 20
WINGS = {"amqp", "client", "contrib", "dashboard", "ops", "reaper", "runtime", "telemetry",
         "worker"}


def test_the_top_level_keeps_only_the_core_and_the_rest_is_in_wings() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()
            } == WINGS


def test_no_module_over_300_lines_and_no_function_over_60() -> None:
    long_modules, long_functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(f"{path.name}: {len(text.splitlines())}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.name}:{node.name}: {n}")
    assert (long_modules, long_functions) == ([], [])


# The driver's verbs: only the gateway (db.py) calls them on a pool or a
# connection; every other module passes a statement of queries.sql to
# db.fetch / fetchrow / fetchval / execute, which guard a pooled connection
# that broke (issue #29: the reaper and the lost-message check did not).
DRIVER_VERBS = {"fetch", "fetchrow", "fetchval", "execute", "executemany", "prepare",
                "copy_records_to_table", "copy_to_table", "copy_from_query", "cursor"}
GATEWAY = {"db.py"}
# SQL written in Python: only the loader and the generator of the statement
# functions (routines.py wraps each granted statement of queries.sql in its
# CREATE FUNCTION, with the SET clauses it needs).
SQL_WORDS = ("SELECT ", "INSERT ", "UPDATE ", "DELETE ", "CREATE ", "DROP ", "ALTER ",
             "GRANT ", "REVOKE ", "WITH ", "TRUNCATE ", "SET ")
SQL_ALLOWED = {"sql.py", "routines.py"}


def test_only_the_gateway_calls_the_driver() -> None:
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in GATEWAY and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in DRIVER_VERBS):
                calls.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: "
                             f"{ast.unparse(node.func)}")
    assert calls == []


def test_no_sql_is_written_outside_queries_sql() -> None:
    inline = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in SQL_ALLOWED:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef
                                    | ast.AsyncFunctionDef)
                      and n.body and isinstance(n.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docstrings and node.value.lstrip().startswith(SQL_WORDS)):
                inline.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value[:40]!r}")
    assert inline == []


# Typed stores (issue #48): a statement of queries.sql is run only by a
# module whose concept is the database side of a role: the lease (lease.py),
# each wing's store (client/, worker/, reaper/, dashboard/store.py; a waiting
# job's, worker/waits_store.py), the
# operators' verbs (ops/admin.py), the installer (migrate, routines,
# uninstall) and the gateway (db.py: ping, the clock, the schema check).
# Everything else calls those, so each role's statements are in one place.
STATEMENT_RUNNERS = {"lease.py", "db.py", "sql.py", "client/store.py", "worker/store.py",
                     "worker/waits_store.py",
                     "reaper/store.py", "dashboard/store.py", "ops/admin.py",
                     "ops/schedule_admin.py",
                     "ops/migrate.py", "ops/routines.py", "ops/uninstall.py"}


def test_only_stores_run_statements() -> None:
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        if name in STATEMENT_RUNNERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                    and node.value.id == "Q"):
                outside.append(f"{name}:{node.lineno}")
    assert outside == []
