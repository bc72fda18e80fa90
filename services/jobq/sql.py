"""Loads ``queries.sql`` once into a mapping of name → SQL text.

Each block starts with ``-- name: <name>``; comment lines right after it are
its documentation. Code refers to statements by name (``Q["claim"]``), never
with ad-hoc SQL strings, so every statement can be read in one file and is
prepared against the schema by a test.

``-- optional: $n`` (in a granted block) gives the function's parameters
from $n on the default NULL: a caller of the previous release, which knew
fewer, still calls it during a rolling upgrade (the statement must read a
NULL there as "not given").

A block may also say ``-- grant: jobq_consumer[, jobq_producer]``: roles that
run it without any right on the tables it touches. ``jobq migrate`` installs
such a statement as a SECURITY DEFINER function ``jobq.q_<name>`` (see
routines.py), and ``Q[name]`` is then the call of that function, with the
same parameters and result columns. ``BODY[name]`` is always the statement
itself (for the migration and for the plan tests). Only such a block may
hold several statements (each ending with ``;`` at the end of a line): the
function runs them in order, each with a fresh snapshot, and returns what
the last one returns. ``-- plan: generic`` makes such a function keep one
plan per session instead of planning every call (routines.py says when that
is safe). ``-- fast: <other>`` gives such a function a lean path: block
``<other>`` holds two statements, a SELECT of one boolean (the guard) and
the lean statement (same result columns); when the guard is true the
function returns the lean statement's rows and runs nothing else. The claim
uses it: a queue with no limit, no pause and no waiting priority job is
claimed by the statement it always had, without the flow-control nodes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType

_NAME = re.compile(r"^--\s*name:\s*([a-z_0-9]+)\s*$", re.MULTILINE)
_GRANT = re.compile(r"^--\s*grant:\s*(.+?)\s*$")
_GENERIC = re.compile(r"^--\s*plan:\s*generic\s*$")
_FAST = re.compile(r"^--\s*fast:\s*([a-z_0-9]+)\s*$")
_OPTIONAL = re.compile(r"^--\s*optional:\s*\$(\d+)\s*$", re.MULTILINE)
_PARAM = re.compile(r"\$(\d+)")
ROLE = re.compile(r"^jobq_[a-z]+$")


def parse(text: str) -> tuple[dict[str, str], dict[str, tuple[str, ...]], frozenset[str],
                               dict[str, str]]:
    """(name → statement, name → roles granted it as a function, names
    whose function keeps a generic plan, name → its fast-path block)."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    grants: dict[str, tuple[str, ...]] = {}
    generic: set[str] = set()
    fast: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in queries:
            raise ValueError(f"queries.sql defines {name!r} twice")
        lines = body.strip().splitlines()
        for ln in lines:
            if m := _GRANT.match(ln.strip()):
                roles = tuple(r.strip() for r in m.group(1).split(","))
                if not all(ROLE.match(r) for r in roles):
                    raise ValueError(f"queries.sql: {name}: bad grant line {ln!r}")
                grants[name] = roles
            elif _GENERIC.match(ln.strip()):
                generic.add(name)
            elif m := _FAST.match(ln.strip()):
                fast[name] = m.group(1)
        code = [ln for ln in lines if not ln.lstrip().startswith("--")]
        queries[name] = "\n".join(code).strip().rstrip(";")
    lean = set(fast.values())
    for name, body in queries.items():
        if len(statements(body)) > 1 and name not in grants and name not in lean:
            raise ValueError(f"queries.sql: {name}: several statements need a grant line "
                             "(they run as one function)")
    for name, other in fast.items():
        if name not in grants or other not in queries or len(statements(queries[other])) != 2:
            raise ValueError(f"queries.sql: {name}: -- fast: names a block of two statements "
                             "(guard, lean statement) of a granted statement")
    if generic - set(grants):
        raise ValueError(f"queries.sql: {sorted(generic - set(grants))}: only a granted "
                         "statement (a function) keeps a generic plan")
    return queries, grants, frozenset(generic), fast


def statements(body: str) -> list[str]:
    """The statements of a block: split after a ``;`` that ends a line,
    outside ``$$``-quoted bodies (a ``DO`` block is one statement)."""
    out, current = [], []
    for i, part in enumerate(body.split("$$")):
        if i % 2:  # inside $$ ... $$
            current.append(f"$${part}$$")
            continue
        pieces = re.split(r";[ \t]*\n", part)
        current.append(pieces[0])
        for piece in pieces[1:]:
            out.append("".join(current))
            current = [piece]
    out.append("".join(current))
    return [p.strip() for p in out if p.strip()]


def arity(statement: str) -> int:
    """How many positional parameters ($1..$n) a statement takes."""
    return max((int(n) for n in _PARAM.findall(statement)), default=0)


def function_name(name: str) -> str:
    return f"jobq.q_{name}"


def call(name: str, statement: str) -> str:
    args = ", ".join(f"${i}" for i in range(1, arity(statement) + 1))
    return f"SELECT * FROM {function_name(name)}({args})"


def optional(text: str) -> dict[str, int]:
    """name -> the first parameter a previous release's caller may leave out."""
    parts = _NAME.split(text)
    return {name: int(m.group(1)) for name, body in zip(parts[1::2], parts[2::2])
            if (m := _OPTIONAL.search(body))}


_TEXT = resources.files("jobq").joinpath("queries.sql").read_text(encoding="utf-8")
_BODY, _GRANTS, GENERIC_PLAN, _FASTS = parse(_TEXT)
BODY: Mapping[str, str] = MappingProxyType(_BODY)
GRANTS: Mapping[str, tuple[str, ...]] = MappingProxyType(_GRANTS)
FAST: Mapping[str, str] = MappingProxyType(_FASTS)
OPTIONAL: Mapping[str, int] = MappingProxyType(optional(_TEXT))

# A fast path's block runs only inside its function (routines.py), so it
# has no entry here; tests prepare it with the function's parameter types.
Q: Mapping[str, str] = MappingProxyType(
    {name: call(name, body) if name in GRANTS else body for name, body in BODY.items()
     if name not in set(_FASTS.values())}
)
