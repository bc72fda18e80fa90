"""Loads ``queries.sql`` once into a mapping of name → SQL text.

Each block starts with ``-- name: <name>``; comment lines right after it are
its documentation. Code refers to statements by name (``Q["claim"]``), never
with ad-hoc SQL strings, so every statement can be read in one file and is
prepared against the schema by a test.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType

_NAME = re.compile(r"^--\s*name:\s*([a-z_0-9]+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in queries:
            raise ValueError(f"queries.sql defines {name!r} twice")
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


Q: Mapping[str, str] = MappingProxyType(
    parse(resources.files("jobq").joinpath("queries.sql").read_text(encoding="utf-8"))
)
