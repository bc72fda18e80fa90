"""schema/current.sql is the schema the migrations make (issue #34): a test
database migrated by `jobq migrate` dumps to exactly that file; and
docs/reference/sql.md names every table, view and function in it."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from harness.helpers import SyncDB

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "schema"))
import dump  # noqa: E402


@pytest.mark.skipif(shutil.which("pg_dump") is None, reason="needs pg_dump (postgresql-client)")
def test_current_sql_is_what_the_migrations_make(db_url: str) -> None:
    assert dump.dump(db_url) == (ROOT / "schema" / "current.sql").read_text(), (
        "schema/current.sql is stale: run python schema/dump.py")


def test_the_sql_reference_names_every_table_view_and_function(db: SyncDB) -> None:
    page = (ROOT / "docs" / "reference" / "sql.md").read_text()
    names = db.val("""
        SELECT array_agg(name) FROM (
            SELECT relname AS name FROM pg_class
            WHERE relnamespace = 'jobq'::regnamespace AND relkind IN ('r', 'v', 'p')
            UNION
            SELECT proname FROM pg_proc
            WHERE pronamespace = 'jobq'::regnamespace AND proname NOT LIKE 'q\\_%') n""")
    missing = sorted(n for n in names if not re.search(rf"jobq\.{n}\b", page))
    assert not missing, f"docs/reference/sql.md does not name: {missing}"
