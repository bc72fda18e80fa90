"""Every code block of the README and docs/ runs as written (issues #13, #34):
Python blocks are named after the file they are (`# name.py`) and run
(against real services where they publish); SQL blocks run on a migrated
database (in a transaction rolled back; `'…'` stands for a value of yours and
is replaced by one); each `jobq …` line of a shell block parses with the
real argument parser; the tutorial's shell blocks run, in order, as one
script: a consumer SIGKILLed mid-job and its job running again.
docs/how-to/frameworks.md's blocks: tests/integration/test_examples.py."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness.helpers import Procs, SyncDB, run_cli, wait_until
from jobq.ops.cli import parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PLACEHOLDER_ID = "00000000-0000-0000-0000-000000000000"


def blocks(page: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", page.read_text(), re.S)


def python_blocks(page: Path) -> dict[str, str]:
    named = {}
    for b in blocks(page, "python"):
        first = b.splitlines()[0]
        assert first.startswith("# ") and first.endswith(".py"), f"{page}: unnamed {first!r}"
        named[first[2:]] = b
    return named


def _write(tmp: Path, page: str, *names: str) -> dict[str, str]:
    found = python_blocks(ROOT / page)
    for n in names:
        (tmp / n).write_text(found[n])
    return found


def _consume(procs: Any, env: dict[str, str], tmp: Path, module: str) -> Any:
    """``jobq consume <module>:app`` with the written example importable."""
    return procs.start("consume", f"{module}:app",
                       PYTHONPATH=f"{tmp}{os.pathsep}{env['PYTHONPATH']}")


def _run(env: dict[str, str], tmp: Path, *argv: str, timeout: float = 60) -> str:
    out = subprocess.run([sys.executable, *argv], env={
        **env, "PYTHONPATH": f"{tmp}{os.pathsep}{env['PYTHONPATH']}"}, cwd=tmp,
        capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_every_python_block_is_named_and_each_is_tested() -> None:
    named = {p.relative_to(ROOT).as_posix(): sorted(python_blocks(p)) for p in PAGES}
    assert {k: v for k, v in named.items() if v} == {
        "README.md": ["myapp.py", "publish_example.py"],
        "docs/how-to/flow-control.md": ["deadline_example.py", "flow_example.py",
                                        "handler_flow_example.py", "key_policy_example.py",
                                        "unique_example.py"],
        "docs/how-to/frameworks.md": sorted([
            "handles_example.py", "examples/django_project/signup/views.py",
            "examples/django_project/signup/tasks.py", "psycopg_example.py",
            "sqlalchemy_example.py", "examples/fastapi_app/main.py"]),
        "docs/how-to/handlers.md": ["hooks_example.py", "myapp.py", "named_tasks_example.py",
                                    "publish_example.py", "retry_example.py"],
        "docs/how-to/results.md": ["stream_example.py"],
        "docs/how-to/workflows.md": ["workflow_example.py"],
        "docs/how-to/waiting.md": ["agent_example.py", "approve_example.py",
                                   "fanout_example.py", "waiting_example.py"],
    }


def test_the_readme_handlers_and_publish_script(tmp_path: Path, env: dict[str, str],
                                                db: SyncDB) -> None:
    _write(tmp_path, "README.md", "myapp.py", "publish_example.py")
    out = _run(env, tmp_path, "-c", "import myapp; print(sorted(myapp.app.handlers))")
    assert out.strip() == "['emails', 'thumbnails']"
    printed = _run(env, tmp_path, "publish_example.py").split()
    assert len(printed) == 5 and all(uuid.UUID(p) for p in printed)  # plain ids
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'emails'") == 5
    assert db.val("SELECT count(*) FROM jobq.job WHERE idempotency_key = 'order-42'") == 1


def test_the_handlers_page_runs_as_written(tmp_path: Path, env: dict[str, str],
                                          db: SyncDB) -> None:
    _write(tmp_path, "docs/how-to/handlers.md", "myapp.py", "publish_example.py")
    out = _run(env, tmp_path, "-c", "import myapp; print(sorted(myapp.app.handlers))")
    assert out.strip() == "['emails', 'thumbnails']"
    _run(env, tmp_path, "publish_example.py")
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'emails'") == 6
    assert db.val("SELECT count(*) FROM jobq.job WHERE idempotency_key = 'order-42'") == 1


def test_the_named_tasks_example_puts_two_tasks_on_one_queue(tmp_path: Path,
                                                             env: dict[str, str]) -> None:
    _write(tmp_path, "docs/how-to/handlers.md", "named_tasks_example.py")
    out = _run(env, tmp_path, "-c", "import named_tasks_example as m; "
               "print(sorted(m.app.tasks['default']), m.app.queues, "
               "m.send_welcome.encode(m.Welcome(email='a@b.c')))")
    assert out.strip() == ("['resize_image', 'send_welcome'] ['default'] "
                           "{'task': 'send_welcome', 'payload': {'email': 'a@b.c'}}")


def test_the_retry_example_declares_its_policy(tmp_path: Path, env: dict[str, str]) -> None:
    _write(tmp_path, "docs/how-to/handlers.md", "retry_example.py")
    out = _run(env, tmp_path, "-c", "import retry_example as m; "
               "p = m.app.handlers['charges'].policy; "
               "print(p.max_attempts, p.backoff_base_s, p.backoff_max_s, p.timeout_s, "
               "p.refused(m.PaymentDeclined()), p.refused(KeyError()), "
               "p.refused(ConnectionResetError()))")
    assert out.split() == ["8", "2", "300", "30", "fail_on", "not", "in", "retry_on", "None"]


def test_the_deadline_example_runs_as_written(tmp_path: Path, env: dict[str, str],
                                              db: SyncDB) -> None:
    _write(tmp_path, "docs/how-to/flow-control.md", "deadline_example.py")
    jid = uuid.UUID(_run(env, tmp_path, "deadline_example.py").strip())
    left = db.val("SELECT extract(epoch FROM expires_at - created_at) FROM jobq.job "
                  "WHERE id = $1", jid)
    assert 59 < left <= 60.5


def test_the_unique_example_runs_as_written(tmp_path: Path, env: dict[str, str],
                                            db: SyncDB) -> None:
    _write(tmp_path, "docs/how-to/flow-control.md", "unique_example.py")
    out = _run(env, tmp_path, "unique_example.py")
    held = db.val("SELECT id FROM jobq.job WHERE queue = 'digest'")
    assert out.strip() == f"already queued: {held}"
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'sync'") == 1


def test_the_stream_example_runs_as_written(tmp_path: Path, env: dict[str, str],
                                            procs: Procs) -> None:
    _write(tmp_path, "docs/how-to/results.md", "stream_example.py")
    procs.start("consume", "stream_example:app", "--queue", "summaries",
                environ={"PYTHONPATH": f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"})
    out = _run(env, tmp_path, "stream_example.py", timeout=60)
    assert out.splitlines() == ["1 one two three", "2 four five"], out


def test_the_flow_control_script_runs_as_written(tmp_path: Path, env: dict[str, str],
                                                 db: SyncDB) -> None:
    _write(tmp_path, "docs/how-to/flow-control.md", "flow_example.py")
    _run(env, tmp_path, "flow_example.py")
    assert db.val("SELECT priority FROM jobq.job WHERE queue = 'reports'") == 5
    assert db.val("SELECT count(*) FROM jobq.job WHERE key = 'tenant-42'") == 3
    assert db.val("SELECT payload->>'q' FROM jobq.job WHERE queue = 'search'") == "job"
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'search'") == 1


def test_the_handler_flow_example_snoozes_and_holds_as_written(
        tmp_path: Path, env: dict[str, str], db: SyncDB, procs: Any, settings: Any) -> None:
    from harness.helpers import publish

    _write(tmp_path, "docs/how-to/flow-control.md", "handler_flow_example.py")
    _consume(procs, env, tmp_path, "handler_flow_example")
    early, throttled = publish(settings, "invoices", [{"ready": False}, {"throttled": True}])
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE snoozes = 1") == 2, 30,
               "both put back")
    rows = {r["id"]: r for r in db.fetch(
        "SELECT id, attempts, extract(epoch FROM run_at - now()) AS due_in FROM jobq.job")}
    assert rows[early]["attempts"] == rows[throttled]["attempts"] == 0
    assert 25 < rows[early]["due_in"] <= 30 and 5 < rows[throttled]["due_in"] <= 10
    assert db.val("SELECT count(*) FROM jobq.key_hold WHERE queue = 'invoices' "
                  "AND key = '' AND until > now()") == 1


def test_the_key_policy_example_returns_the_live_job_as_written(
        tmp_path: Path, env: dict[str, str], db: SyncDB) -> None:
    _write(tmp_path, "docs/how-to/flow-control.md", "key_policy_example.py")
    assert run_cli(env, "queue", "set", "reports", "--key-policy", "singleton").returncode == 0
    printed = _run(env, tmp_path, "key_policy_example.py").split()
    assert db.val("SELECT array_agg(id) FROM jobq.job WHERE queue = 'reports'") == [
        uuid.UUID(printed[0])]


def test_the_waiting_example_waits_for_its_signal_as_written(
        tmp_path: Path, env: dict[str, str], db: SyncDB, procs: Any, settings: Any) -> None:
    from harness.helpers import publish

    _write(tmp_path, "docs/how-to/waiting.md", "waiting_example.py", "approve_example.py")
    procs.reaper()  # the relay after the cool-down, and the wake
    _consume(procs, env, tmp_path, "waiting_example")
    (jid,) = publish(settings, "refunds", [{"order": "42"}])
    wait_until(lambda: db.val("SELECT wake_on FROM jobq.job WHERE id = $1", jid) == "approval",
               30, "the job waiting for its approval")
    assert db.val("SELECT lease_expires_at FROM jobq.job WHERE id = $1", jid) is None
    assert _run(env, tmp_path, "approve_example.py", str(jid)).strip() == "True"
    wait_until(lambda: db.val("SELECT status FROM jobq.job WHERE id = $1", jid) == "completed",
               30, "the refund done after its cool-down")
    assert db.val("SELECT result FROM jobq.job WHERE id = $1", jid) == (
        '{"by": "ana", "ticket": "T-42", "refunded": true}')


def test_the_fanout_example_joins_its_children_as_written(
        tmp_path: Path, env: dict[str, str], db: SyncDB, procs: Any, settings: Any) -> None:
    from harness.helpers import publish

    _write(tmp_path, "docs/how-to/waiting.md", "fanout_example.py")
    procs.reaper()
    _consume(procs, env, tmp_path, "fanout_example")
    (jid,) = publish(settings, "reports", [{"regions": ["eu", "us", "apac"]}])
    wait_until(lambda: db.val("SELECT status FROM jobq.job WHERE id = $1", jid) == "completed",
               30, "the report joined its regions")
    assert db.val("SELECT result FROM jobq.job WHERE id = $1", jid) == '{"done": 3, "failed": 0}'
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'regions'") == 3


def test_the_agent_example_loops_through_its_tools_as_written(
        tmp_path: Path, env: dict[str, str], db: SyncDB, procs: Any, settings: Any) -> None:
    from harness.helpers import publish

    _write(tmp_path, "docs/how-to/waiting.md", "agent_example.py")
    procs.reaper()
    _consume(procs, env, tmp_path, "agent_example")
    (jid,) = publish(settings, "agents", [{"question": "why?"}])
    wait_until(lambda: db.val("SELECT status FROM jobq.job WHERE id = $1", jid) == "completed",
               30, "the agent's answer")
    assert db.val("SELECT result FROM jobq.job WHERE id = $1", jid) == (
        '{"turns": 3, "answer": "done after 2 tool calls"}')
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'tools'") == 2
    # three thoughts streamed, each once, though the handler ran three times
    assert db.val("SELECT array_agg(chunk->>'turn' ORDER BY n) FROM jobq.job_output "
                  "WHERE job_id = $1", jid) == ["0", "1", "2"]


def test_the_hooks_example_runs_around_a_job_as_written(
        tmp_path: Path, env: dict[str, str], db: SyncDB, procs: Any, settings: Any) -> None:
    from harness.helpers import publish

    _write(tmp_path, "docs/how-to/handlers.md", "hooks_example.py")
    proc = _consume(procs, env, tmp_path, "hooks_example")
    (jid,) = publish(settings, "invoices", [{"tenant": "acme"}])
    wait_until(lambda: db.val("SELECT result FROM jobq.job WHERE id = $1", jid) == '"acme"',
               30, "the handler saw the middleware's tenant")
    assert proc.alive()


def test_the_workflow_example_publishes_and_runs_as_written(
        tmp_path: Path, env: dict[str, str], db: SyncDB, procs: Any) -> None:
    _write(tmp_path, "docs/how-to/workflows.md", "workflow_example.py")
    _run(env, tmp_path, "workflow_example.py")
    procs.reaper()
    _consume(procs, env, tmp_path, "workflow_example")
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'") == 4,
               30, "the workflow's four steps")
    result = db.val("SELECT result FROM jobq.job WHERE queue = 'checkout'")
    assert '"charge": "ch_1"' in result and "2-small.png" in result
    assert db.val("SELECT count(*) FROM jobq.job_step WHERE name = 'charge'") == 1


def test_every_sql_block_runs_on_a_migrated_database(db: SyncDB) -> None:
    name = db.val("SELECT current_database()")
    ran = 0
    for page in PAGES:
        for block in blocks(page, "sql"):
            text = (block.replace("'…'", f"'{PLACEHOLDER_ID}'")
                    .replace("DATABASE app ", f"DATABASE {name} "))
            db.execute("BEGIN")  # a block's statements build on each other
            try:
                for statement in (s for s in re.split(r";\s*(?:--[^\n]*)?\n", text)
                                  if s.strip()):
                    try:
                        db.execute(statement)
                    except Exception as exc:
                        raise AssertionError(f"{page.name}: {statement!r}: {exc}") from exc
                    ran += 1
            finally:
                db.execute("ROLLBACK")
    assert ran >= 15


def _jobq_lines() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for block in blocks(page, "sh"):
            for line in block.splitlines():
                command = line.split(" #")[0].strip().removeprefix("$ ")
                command = re.sub(r"^(JOBQ_\w+=\S+ )+", "", command)
                command = re.sub(r"^[A-Z_]+=\$\((jobq .*)\)$", r"\1", command)
                if command.startswith("jobq ") and "…" not in command:
                    out.append((page.name, command.removesuffix(" &")))
    return out


@pytest.mark.parametrize(("page", "command"), _jobq_lines())
def test_every_jobq_command_line_parses(page: str, command: str) -> None:
    words = []
    for w in shlex.split(command)[1:]:  # the command, without redirections and what follows
        if w in ("|", ";", "&&", "&") or w.startswith((">", "2>")):
            break
        words.append(w)
    try:
        parser().parse_args(words)
    except SystemExit as exc:
        raise AssertionError(f"{page}: `{command}` does not parse") from exc


def test_the_tutorial_runs_as_written(env: dict[str, str], pg_admin_url: str,
                                      tmp_path: Path) -> None:
    """Its shell blocks in order, as one bash script, as a user pastes them:
    only the install line is left out (the suite's .venv is jobq installed) and
    the server's address and a fresh database name replace the page's."""
    script = "\n".join(blocks(ROOT / "docs" / "tutorial.md", "sh"))
    script = script.replace("make install && source .venv/bin/activate", "true")
    server = pg_admin_url.rsplit("/", 1)[0]
    dbname = f"jobq_tutorial_{uuid.uuid4().hex[:8]}"
    script = (script.replace("postgresql://postgres@127.0.0.1:5432", server)
              .replace("jobq_tutorial", dbname)
              .replace("amqp://guest:guest@127.0.0.1:5672/", env["JOBQ_AMQP_URL"])
              .replace("JOBQ_NAMESPACE=tutorial", f"JOBQ_NAMESPACE={env['JOBQ_NAMESPACE']}t"))
    (tmp_path / "tutorial.sh").write_text(script)  # no `set -e`: a user's shell has none
    run_env = {k: v for k, v in env.items() if not k.startswith("JOBQ_")}
    run_env["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{env.get('PATH', '')}"
    # Not in the page: the consumer still running the 20 s job at the end
    # drains it for the default 25 s on SIGTERM; a second is enough here.
    run_env["JOBQ_CONSUMER__SHUTDOWN_GRACE_S"] = "1"
    try:
        out = subprocess.run(["bash", "tutorial.sh"], cwd=tmp_path, env=run_env,
                             capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(["dropdb", "--if-exists", "--force", f"--maintenance-db={pg_admin_url}",
                        dbname], capture_output=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "active|2" in out.stdout, out.stdout[-3000:]
    assert "removed schema jobq" in out.stdout and "worker_vanished" in out.stdout
    assert "DROP DATABASE" in out.stdout, out.stderr[-2000:]
    # What the page says happened is what the history shows, event for event
    # (it once left out enqueued and isolated), step 1's broker line is what
    # migrate printed, and the logs did not land where the user stands.
    page = (ROOT / "docs" / "tutorial.md").read_text()
    said = re.search(r'jobq inspect "\$JOB" +# (.*)', page)
    assert said is not None
    told = [w.split(" (")[0] for w in said.group(1).split(" · ")]
    shown = re.findall(r"^\d{4}-\d\d-\d\d [\d:.]+ +(\w+)", out.stdout, re.M)
    assert shown == told, (shown, told)
    assert "exchange and 0 queue(s)" in out.stdout and "and 0 queue(s)" in page
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tutorial.sh"]
