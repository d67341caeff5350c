"""A run's final status and data survive how the process ends: normal exit, an uncaught
exception, SIGTERM, or a context manager."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tracklake

CHILD = """
import os, signal, sys, time, tracklake
run = tracklake.init(project="p", run_id="r", root=sys.argv[1], capture_identity=False,
                     flush_interval=60)
for step in range(50):
    run.log({{"x": float(step)}}, step=step)
{ending}
"""


def _child(root: Path, ending: str) -> subprocess.Popen[str]:
    code = CHILD.format(ending=textwrap.dedent(ending))
    return subprocess.Popen([sys.executable, "-c", code, str(root)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _status_and_count(root: Path) -> tuple[str, int]:
    rows = tracklake.query("SELECT (SELECT status FROM runs) AS status, "
                           "(SELECT count(*) FROM metrics) AS n", root=root).to_pylist()
    return rows[0]["status"], rows[0]["n"]


def test_a_script_that_ends_without_finish_is_finished_with_all_data(root: Path) -> None:
    proc = _child(root, "")
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert _status_and_count(root) == ("finished", 50)


def test_an_uncaught_exception_marks_the_run_failed_and_keeps_the_data(root: Path) -> None:
    proc = _child(root, "raise RuntimeError('diverged')")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "diverged" in err
    assert _status_and_count(root) == ("failed", 50)


def test_sigterm_flushes_and_marks_the_run_killed(root: Path) -> None:
    proc = _child(root, "print('ready', flush=True)\ntime.sleep(60)")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM  # the default action still happens
    assert _status_and_count(root) == ("killed", 50)


def test_a_users_own_sigterm_handler_still_runs_after_the_flush(root: Path) -> None:
    """A handler installed before init() is chained: tracklake flushes, then calls it."""
    code = textwrap.dedent("""
        import signal, sys, time, tracklake
        def handler(signum, frame):
            print("user handler", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, handler)
        run = tracklake.init(project="p", run_id="r", root=sys.argv[1],
                             capture_identity=False, flush_interval=60)
        run.log({"y": 1.0}, step=0)
        print("ready", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, str(root)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert "user handler" in out
    assert _status_and_count(root) == ("killed", 1)


THREADED_CHILD = """
import os, signal, sys, threading, time, tracklake
{before}
run = tracklake.init(project="p", run_id="r", root=sys.argv[1], capture_identity=False,
                     flush_interval=60)
for step in range(50):
    run.log({{"x": float(step)}}, step=step)
{after}
parked = threading.Event()
worker = threading.Thread(target=parked.wait, daemon=True)
worker.start()
print(worker.native_id, flush=True)
{wait}
"""
#: The main thread blocked in a read, as a training loop waiting on a queue or a socket.
READ = "sys.stdin.read()"


def _sigterm_to_a_thread(pid: int, thread: int) -> None:
    """SIGTERM to one thread of `pid`, as the kernel may deliver a process's SIGTERM to
    any thread that does not block it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.tgkill(pid, thread, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def _threaded_child(root: Path, before: str = "", after: str = "", wait: str = READ) -> tuple[
        subprocess.Popen[str], int]:
    """The child, its stdin left open, and its parked worker thread's id."""
    code = THREADED_CHILD.format(before=textwrap.dedent(before), after=textwrap.dedent(after),
                                 wait=wait)
    proc = subprocess.Popen([sys.executable, "-c", code, str(root)], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _assert_ended_by_sigterm_with_its_run_killed(proc: subprocess.Popen[str], root: Path
                                                 ) -> None:
    """`proc` (stdin left open: its read ends only by the signal) ends killed by SIGTERM,
    its run `killed` with its 50 values."""
    try:
        proc.wait(timeout=60)
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert proc.returncode == -signal.SIGTERM, err
    assert _status_and_count(root) == ("killed", 50)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tgkill is Linux's")
def test_sigterm_taken_by_another_thread_while_the_main_one_reads_still_finishes_the_run(
        root: Path) -> None:
    """Python runs signal handlers on the main thread only, when it next runs Python code:
    blocked in a read, it never did, and the process neither finished its run nor ended."""
    proc, worker = _threaded_child(root)
    _sigterm_to_a_thread(proc.pid, worker)
    _assert_ended_by_sigterm_with_its_run_killed(proc, root)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tgkill is Linux's")
def test_a_handler_installed_after_init_keeps_sigterm_to_itself_whichever_thread_takes_it(
        root: Path) -> None:
    """The program replaced tracklake's handler after init(): SIGTERM is its business, even
    when the signal reaches the wakeup pipe from another thread. The run ends as the
    program ends it (here, at exit: finished)."""
    after = """
        def handler(signum, frame):
            print("program's handler", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, handler)
    """
    proc, worker = _threaded_child(root, after=after, wait="""
while True:
    time.sleep(0.05)""")
    _sigterm_to_a_thread(proc.pid, worker)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 3, err
    assert "program's handler" in out
    assert _status_and_count(root) == ("finished", 50)


def test_sigterm_to_a_forked_child_leaves_the_parents_run_running(root: Path) -> None:
    """A forked child (a data loader's worker) shares the finisher's pipe: the SIGTERM that
    ends it must not finish its parent's run."""
    code = textwrap.dedent("""
        import os, signal, sys, time, tracklake
        run = tracklake.init(project="p", run_id="r", root=sys.argv[1],
                             capture_identity=False, flush_interval=60)
        run.log({"x": 0.0}, step=0)
        child = os.fork()
        if child == 0:
            time.sleep(60)
            os._exit(0)
        time.sleep(0.5)  # the child's at-fork hooks have run
        os.kill(child, signal.SIGTERM)
        _, status = os.waitpid(child, 0)
        print("child", os.WTERMSIG(status) if os.WIFSIGNALED(status) else "exited",
              flush=True)
        time.sleep(1)  # time for a wrongly woken finisher to finish the run
        run.log({"x": 1.0}, step=1)
        print("logged after", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, str(root)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.split("\n")[:2] == [f"child {int(signal.SIGTERM)}", "logged after"], out
    assert _status_and_count(root) == ("finished", 2)


def test_a_wakeup_fd_the_program_set_before_init_stays_its_own(root: Path) -> None:
    """asyncio sets Python's wakeup fd for its signal handlers: init() leaves it there
    (SIGTERM then reaches the finisher through the handler alone)."""
    before = """
        theirs_r, theirs = os.pipe()
        os.set_blocking(theirs, False)
        signal.set_wakeup_fd(theirs)
    """
    after = """
        if signal.set_wakeup_fd(theirs) != theirs:
            sys.exit("init() replaced the wakeup fd")
    """
    proc, _ = _threaded_child(root, before, after)
    proc.send_signal(signal.SIGTERM)  # to the process: the main thread takes it
    _assert_ended_by_sigterm_with_its_run_killed(proc, root)


def test_finish_is_idempotent_and_logging_afterwards_raises(root: Path) -> None:
    run = tracklake.init(project="p", run_id="r", root=root, capture_identity=False)
    run.log({"x": 1.0})
    first = run.finish()
    assert first.complete and first.status == "finished"
    assert run.finish("failed") is first
    with pytest.raises(tracklake.RunStateError, match="finished"):
        run.log({"x": 2.0})
    with pytest.raises(tracklake.RunStateError):
        run.log_text("t", "x")


def test_a_running_attempt_whose_writer_is_gone_shows_as_crashed(root: Path) -> None:
    """On this host the writer's process is probed: killed, it shows crashed at once. From
    another host only the heartbeat tells: fresh, running; old, crashed."""
    proc = _child(root, "run.flush(); os.kill(os.getpid(), signal.SIGKILL)")
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert _status_and_count(root) == ("crashed", 50)  # its process is known ended
    path = next(root.glob("runs/**/attempt=1.json"))
    record = json.loads(path.read_text())
    record["identity"]["host"] = "another-node"
    path.write_text(json.dumps(record))
    assert _status_and_count(root) == ("running", 50)  # the heartbeat is fresh
    text = path.read_text().replace(str(time.gmtime().tm_year), "2000", 2)
    path.write_text(text)  # as if the heartbeat were decades old
    assert _status_and_count(root) == ("crashed", 50)


KILLED_CHILD = """
import sys, tracklake
root, run_id, finish_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
run = tracklake.init(project="p", run_id=run_id, root=root, capture_identity=False,
                     flush_interval=60)
print("ready", flush=True)
for step in range(1_000_000):
    run.log({"x": float(step), "y": 1.0}, step=step)
    run.log_generations([("question", "answer", 1.0)], step=step)
    if run.flush():
        print(step, flush=True)  # durable: it must be in the store whatever happens next
    if step == finish_at:
        print("finishing", flush=True)
        run.finish()
        sys.stdin.read()  # wait for the signal
"""


@pytest.mark.slow
def test_sigterm_at_any_point_of_log_flush_or_finish_ends_the_run_killed_with_its_data(
        root: Path) -> None:
    """SIGTERM lands at random points of a loop that logs, logs generations and flushes
    every step (and, in some children, during finish()): every child ends, killed by the
    signal, never deadlocked on its own writer; its attempt is terminal, and every step a
    flush() reported written is stored."""
    rng = random.Random(1234)
    children = []
    for trial in range(12):
        finish_at = rng.randrange(5, 40) if trial % 3 == 2 else 1 << 40
        acks_before_kill = rng.randrange(1, 40) if finish_at == 1 << 40 else None
        proc = subprocess.Popen(
            [sys.executable, "-c", KILLED_CHILD, str(root), f"kill-{trial}", str(finish_at)],
            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        children.append((f"kill-{trial}", proc, acks_before_kill))
    outcomes = {}
    for run_id, proc, acks_before_kill in children:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        acked: list[int] = []
        while True:  # read acknowledgements up to the chosen point, then signal
            line = proc.stdout.readline().strip()
            if line == "finishing" or (line.isdigit() and acks_before_kill is not None
                                       and len(acked) + 1 >= acks_before_kill):
                if line.isdigit():
                    acked.append(int(line))
                break
            acked.append(int(line))
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            outcomes[run_id] = ("deadlocked", acked, err)
            continue
        acked += [int(line) for line in out.split() if line.isdigit()]
        outcomes[run_id] = (proc.returncode, acked, err)
    assert {k: v[0] for k, v in outcomes.items()} == {k: -signal.SIGTERM for k in outcomes}, \
        {k: v[2][-500:] for k, v in outcomes.items() if v[0] != -signal.SIGTERM}
    statuses = {r["run"]: r["status"] for r in tracklake.query(
        "SELECT run, status FROM runs", root=root).to_pylist()}
    stored: dict[str, set[int]] = {run_id: set() for run_id in outcomes}
    for row in tracklake.query("SELECT m.run, m.step FROM metrics m JOIN generations g "
                               "ON m.run = g.run AND m.step = g.step WHERE m.key = 'x'",
                               root=root).to_pylist():
        stored[row["run"]].add(row["step"])
    for trial, (run_id, (_, acked, _)) in enumerate(outcomes.items()):
        expected = "finished" if trial % 3 == 2 else "killed"
        assert statuses[run_id] in (expected, "killed"), (run_id, statuses[run_id])
        assert set(acked) <= stored[run_id], (run_id, sorted(set(acked) - stored[run_id]))


def test_show_and_the_views_say_one_status_for_a_killed_writer(root: Path) -> None:
    """`show` printed the status as recorded ("running") where `runs` and `run_attempts`
    say crashed: every reader shows the one status `effective_status` gives."""
    from click.testing import CliRunner

    from tracklake._cli.main import main

    proc = _child(root, "run.flush(); os.kill(os.getpid(), signal.SIGKILL)")
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    [row] = tracklake.query("SELECT run, status FROM run_attempts", root=root).to_pylist()
    assert row["status"] == "crashed"
    result = CliRunner().invoke(main, ["show", row["run"], "--root", str(root)],
                                terminal_width=200)
    assert result.exit_code == 0, result.output
    [line] = [ln for ln in result.output.splitlines() if ln.lstrip("│ ").startswith("1 ")]
    assert "crashed" in line and "running" not in line, line
