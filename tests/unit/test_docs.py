"""The documentation cannot drift (issue #34): the generated reference pages
and queries.sql's table of contents are what docs/generate.py writes now;
the README stays a front door (at most 200 lines, no engineering log); the
invariants table of "how it works" names statements that exist; every page
is in the site's navigation."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from jobq.sql import Q

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs"))
import generate  # noqa: E402


@pytest.mark.parametrize("rel", sorted(generate.PAGES))
def test_generated_pages_are_current(rel: str) -> None:
    assert (ROOT / "docs" / rel).read_text() == generate.PAGES[rel](), (
        f"docs/{rel} is stale: run python docs/generate.py")


def test_queries_table_of_contents_is_current() -> None:
    assert generate.QUERIES.read_text() == generate.queries_with_toc(), (
        "queries.sql's contents are stale: run python docs/generate.py")


def test_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert not re.search(r"issue #\d+|#\d{2}\b", text)


def test_how_it_works_names_statements_that_exist() -> None:
    page = (ROOT / "docs" / "explanation" / "how-it-works.md").read_text()
    table = page.split("## The invariants", 1)[1].split("\n## ", 1)[0]
    kept_by = [row.split("|")[2] for row in table.splitlines() if row.startswith("| **I")]
    assert len(kept_by) == 12  # DESIGN.md I1-I12
    words = {w for cell in kept_by for w in re.findall(r"`([a-z_]+)`", cell)}
    not_statements = {"lock", "release", "released", "max_stalls", "vanished_grace_s",
                      "waiting_on", "wake_on",
                      "lease_expires_at"}
    missing = sorted(w for w in words - not_statements if w not in Q)
    assert not missing, f"how-it-works.md names statements queries.sql lacks: {missing}"


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert {p for p in pages if p not in nav} == set()
