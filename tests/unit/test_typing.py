"""Typed task handles are typed (issue #32): mypy --strict accepts a file
that publishes the right payloads and rejects, line by line, one that
publishes wrong ones. Runs mypy's own API on tests/typing/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api", reason="mypy is a test dependency (pip install -e '.[test]')")
HERE = Path(__file__).resolve().parent.parent / "typing"
ROOT = HERE.parent.parent


def _mypy(name: str) -> tuple[str, int]:
    out, err, code = api.run(["--strict", "--no-error-summary", "--config-file", "",
                              "--cache-dir", str(ROOT / ".mypy_cache"),
                              str(HERE / name)])
    return out + err, code


def test_mypy_accepts_right_payloads() -> None:
    out, code = _mypy("tasks_ok.py")
    assert code == 0, out


def test_mypy_rejects_each_wrong_payload_and_nothing_else() -> None:
    out, code = _mypy("tasks_bad.py")
    text = (HERE / "tasks_bad.py").read_text().splitlines()
    wanted = {n for n, line in enumerate(text, 1) if "# error:" in line}
    found = {int(m.group(1)) for m in re.finditer(r"tasks_bad\.py:(\d+): error", out)}
    assert code == 1 and found == wanted, out
