"""The protocol's models checked by SPIN (issue #36), each exhaustive for
2 workers x 3 jobs x 2 reapers: model/lease.pml (the lease, with a crash
and a freeze) and model/delivery.pml (publishing, the relay, delivery, acks,
redelivery and the lost-message check, with the lease and a crash). No
assertion violated and no invalid end state (no job left unfinished); each
mutation gives a counterexample, so neither model is vacuous; every
statement of queries.sql the models name still exists."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from jobq.sql import Q

MODELS = Path(__file__).resolve().parents[2] / "model"
needs_spin = pytest.mark.skipif(shutil.which("spin") is None or shutil.which("gcc") is None,
                                reason="needs spin and gcc (Debian's spin package; .ci/run)")


def _check(tmp_path: Path, *defines: str, model: str = "lease.pml") -> str:
    (tmp_path / model).write_text((MODELS / model).read_text())
    subprocess.run(["spin", "-a", *(f"-D{d}" for d in defines), model], cwd=tmp_path,
                   check=True, capture_output=True, timeout=60)
    subprocess.run(["gcc", "-O2", "-DSAFETY", "-w", "-o", "pan", "pan.c"], cwd=tmp_path,
                   check=True, capture_output=True, timeout=120)
    out = subprocess.run(["./pan", "-m1000000"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    return out.stdout


@needs_spin
@pytest.mark.parametrize("model", ["lease.pml", "delivery.pml"])
def test_the_protocol_holds_exhaustively(tmp_path: Path, model: str) -> None:
    out = _check(tmp_path, model=model)
    assert "errors: 0" in out and "Search not completed" not in out, out
    states = int(re.search(r"(\d+) states, stored", out).group(1))  # type: ignore[union-attr]
    print(f"\nmodel/{model}: {states:,} states, no violation")
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


@needs_spin
def test_without_the_relay_a_job_is_lost(tmp_path: Path) -> None:
    out = _check(tmp_path, "NO_RELAY", model="delivery.pml")
    assert "errors: 1" in out and "invalid end state" in out, out


def test_every_statement_the_models_name_exists() -> None:
    named = {n for m in ("lease.pml", "delivery.pml")
             for n in re.findall(r"queries\.sql: (\w+)", (MODELS / m).read_text())}
    assert named >= {"claim", "renew", "complete", "workers_vanished", "requeue_lapsed",
                     "relay_take", "unpublish_lost", "enqueue_many"}
    assert sorted(n for n in named if n not in Q) == []
