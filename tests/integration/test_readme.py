"""The README's Python blocks run as written (issue #13): the handler module
imports and registers what it says, the publishing script runs against real
services and enqueues what it says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from harness.helpers import SyncDB

ROOT = Path(__file__).resolve().parents[2]


def python_blocks() -> dict[str, str]:
    """README ```python blocks, keyed by the file name on their first line."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    named = {}
    for b in blocks:
        first = b.splitlines()[0]
        assert first.startswith("# ") and first.endswith(".py"), f"unnamed block: {first!r}"
        named[first[2:]] = b
    return named


def test_every_python_block_is_named_and_there_are_four() -> None:
    assert set(python_blocks()) == {"myapp.py", "publish_example.py", "flow_example.py",
                                    "workflow_example.py"}


def test_the_handler_module_imports_and_registers_its_queues(tmp_path: Path) -> None:
    (tmp_path / "myapp.py").write_text(python_blocks()["myapp.py"])
    out = subprocess.run(
        [sys.executable, "-c", "import myapp; print(sorted(myapp.app.handlers))"],
        cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['emails', 'thumbnails']"


def test_the_publishing_script_runs_as_written(tmp_path: Path, env, db: SyncDB) -> None:
    script = tmp_path / "publish_example.py"
    script.write_text(python_blocks()["publish_example.py"])
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'emails'") == 6
    assert db.val("SELECT count(*) FROM jobq.job WHERE idempotency_key = 'order-42'") == 1


def test_the_flow_control_script_runs_as_written(tmp_path: Path, env, db: SyncDB) -> None:
    script = tmp_path / "flow_example.py"
    script.write_text(python_blocks()["flow_example.py"])
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert db.val("SELECT priority FROM jobq.job WHERE queue = 'reports'") == 5
    assert db.val("SELECT count(*) FROM jobq.job WHERE key = 'tenant-42'") == 3
    assert db.val("SELECT payload->>'q' FROM jobq.job WHERE queue = 'search'") == "job"
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'search'") == 1


def test_the_workflow_example_publishes_and_runs_as_written(tmp_path: Path, env, db: SyncDB,
                                                           procs) -> None:
    from harness.helpers import wait_until

    (tmp_path / "workflow_example.py").write_text(python_blocks()["workflow_example.py"])
    out = subprocess.run([sys.executable, "workflow_example.py"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    procs.reaper()
    procs.start("consume", "workflow_example:app",
                PYTHONPATH=f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}")
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'") == 4,
               30, "the workflow's four steps")
    result = db.val("SELECT result FROM jobq.job WHERE queue = 'checkout'")
    assert '"charge": "ch_1"' in result and "2-small.png" in result
    assert db.val("SELECT count(*) FROM jobq.job_step WHERE name = 'charge'") == 1


class _RolledBack(Exception):
    pass


def test_the_least_privilege_sql_runs_as_written(db_url: str) -> None:
    """The two ```sql blocks (a DBA's bootstrap, then the services' logins),
    in one transaction that is rolled back: roles are cluster-wide."""
    import asyncio

    import asyncpg

    blocks = [b for b in re.findall(r"```sql\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
              if "CREATE ROLE" in b]
    assert len(blocks) == 2

    async def go() -> None:
        conn = await asyncpg.connect(db_url)
        name = await conn.fetchval("SELECT current_database()")
        try:
            async with conn.transaction():
                await conn.execute(blocks[0].replace("DATABASE app ", f"DATABASE {name} "))
                await conn.execute(blocks[1])
                rows = await conn.fetch(
                    "SELECT m.rolname AS login, g.rolname AS grp FROM pg_auth_members a "
                    "JOIN pg_roles m ON m.oid = a.member JOIN pg_roles g ON g.oid = a.roleid "
                    "WHERE m.rolname LIKE 'app\\_%'")
                assert {(r["login"], r["grp"]) for r in rows} == {
                    (f"app_{g}", f"jobq_{g}") for g in ("producer", "consumer", "reaper",
                                                       "reader")}
                raise _RolledBack
        except _RolledBack:
            pass
        finally:
            await conn.close()

    asyncio.run(go())
