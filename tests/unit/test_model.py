"""The lease protocol's model (model/lease.pml) checked by SPIN (issue #36):
exhaustive for 2 workers x 3 jobs x 2 reapers with a crash and a freeze,
no assertion violated and no invalid end state (no job left unfinished);
each of three mutations of the protocol gives a counterexample, so the
model is not vacuous; and every statement of queries.sql the model names
still exists."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from jobq.sql import Q

MODEL = Path(__file__).resolve().parents[2] / "model" / "lease.pml"
needs_spin = pytest.mark.skipif(shutil.which("spin") is None or shutil.which("gcc") is None,
                                reason="needs spin and gcc (Debian's spin package; .ci/run)")


def _check(tmp_path: Path, *defines: str) -> str:
    (tmp_path / "lease.pml").write_text(MODEL.read_text())
    subprocess.run(["spin", "-a", *(f"-D{d}" for d in defines), "lease.pml"], cwd=tmp_path,
                   check=True, capture_output=True, timeout=60)
    subprocess.run(["gcc", "-O2", "-DSAFETY", "-w", "-o", "pan", "pan.c"], cwd=tmp_path,
                   check=True, capture_output=True, timeout=120)
    out = subprocess.run(["./pan", "-m1000000"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    return out.stdout


@needs_spin
def test_the_protocol_holds_exhaustively(tmp_path: Path) -> None:
    out = _check(tmp_path)
    assert "errors: 0" in out and "Search not completed" not in out, out
    states = int(re.search(r"(\d+) states, stored", out).group(1))  # type: ignore[union-attr]
    print(f"\nmodel/lease.pml: {states:,} states, no violation")
    assert states > 100_000  # the search went somewhere


@needs_spin
@pytest.mark.parametrize(("mutation", "violated"), [
    ("NO_FENCE", "assertion violated (owner"),       # a zombie's completion lands
    ("CUT_LIVE", "assertion violated troubled"),     # a live worker's job is charged
    ("CHARGE_ALL", "assertion violated (n==1)"),     # a witness is charged
])
def test_each_mutation_gives_a_counterexample(tmp_path: Path, mutation: str,
                                              violated: str) -> None:
    out = _check(tmp_path, mutation)
    assert "errors: 1" in out and violated in out, out


def test_every_statement_the_model_names_exists() -> None:
    named = set(re.findall(r"queries\.sql: (\w+)", MODEL.read_text()))
    assert named >= {"claim", "renew", "complete", "workers_vanished", "requeue_lapsed"}
    assert sorted(n for n in named if n not in Q) == []
