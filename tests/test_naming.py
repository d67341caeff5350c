"""Names that become path components, run id and rank resolution, and attempt numbering."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracklake
from tracklake import InvalidNameError
from tracklake._format.naming import (
    DEFAULT_ROOT,
    MAX_NAME_LENGTH,
    resolve_rank,
    resolve_root,
    resolve_run_id,
    safe_name,
)

_SAFE = re.compile(r"^[A-Za-z0-9._+@-]+$")


def _init(root: Path, **kw: object) -> tracklake.Run:
    kw.setdefault("capture_identity", False)
    return tracklake.init(root=root, **kw)  # type: ignore[arg-type]


# -- safe_name --------------------------------------------------------------------------

@settings(max_examples=400, deadline=None, derandomize=True)
@given(name=st.one_of(
    st.text(),
    st.text(alphabet="./\\_\x00 ~", max_size=12),
    st.text(alphabet=st.characters(codec="ascii"), min_size=120, max_size=200),
))
def test_safe_name_never_yields_an_escaping_path_component(name: str) -> None:
    """Any text either is refused with InvalidNameError or becomes one harmless path
    component: no '/', no '\\', no NUL, not '.' or '..' (or only dots), at most 128 chars,
    only [A-Za-z0-9._+@-]."""
    try:
        cleaned = safe_name(name, "project")
    except InvalidNameError as exc:
        assert "project name" in str(exc)
        return
    assert "/" not in cleaned and "\\" not in cleaned and "\x00" not in cleaned
    assert cleaned not in (".", "..") and set(cleaned) != {"."}
    assert 0 < len(cleaned) <= MAX_NAME_LENGTH
    assert _SAFE.match(cleaned)
    assert Path(cleaned).name == cleaned and len(Path(cleaned).parts) == 1
    assert safe_name(cleaned, "project") == cleaned  # idempotent


@pytest.mark.parametrize("name", ["", ".", "..", "...", "/", "//", "___", "a\x00b", "  ",
                                  "x" * (MAX_NAME_LENGTH + 1), "\u00e9\u00e8"])
def test_unusable_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidNameError):
        safe_name(name, "run")


@pytest.mark.parametrize(("name", "expected"), [
    ("my-run_1.0", "my-run_1.0"), ("../../etc", ".._.._etc"), ("a/b", "a_b"),
    ("a b  c", "a_b_c"), ("/abs/path/", "abs_path"), ("x" * MAX_NAME_LENGTH, "x" * 128),
    ("user@host+1", "user@host+1"),
])
def test_safe_name_examples(name: str, expected: str) -> None:
    assert safe_name(name, "run") == expected


def test_safe_name_refuses_non_str() -> None:
    with pytest.raises(TypeError, match="must be str"):
        safe_name(3, "run")


def test_hostile_names_write_nothing_outside_the_root(tmp_path: Path) -> None:
    """init(project='../../etc', name=..., run_id=...) and artifact names with '..' keep
    every file under the store root."""
    root = tmp_path / "a" / "b" / "store"
    run = _init(root, project="../../etc", name="../../../name", run_id="../../../../rid",
                config={"k": 1})
    run.log({"x": 1.0}, step=0)
    run.log_text("t", "hello")
    run.log_artifact(b"data", name="../../../../artifact")
    with run.span("s"):
        pass
    run.finish()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files
    outside = [p for p in files if not p.resolve().is_relative_to(root.resolve())]
    assert outside == []
    assert not (tmp_path / "etc").exists() and not (tmp_path / "a" / "etc").exists()
    assert run.project == ".._.._etc"
    assert (root / "runs" / "project=.._.._etc" / f"run={run.id}").is_dir()


# -- run id resolution -----------------------------------------------------------------

def test_run_id_argument_wins_over_every_environment_variable() -> None:
    env = {"TRACKLAKE_RUN_ID": "env", "TORCHELASTIC_RUN_ID": "te", "SLURM_JOB_ID": "5",
           "WORLD_SIZE": "2", "MASTER_ADDR": "h"}
    assert resolve_run_id("given", "p", "n", env) == "given"


def test_tracklake_run_id_wins_over_launchers() -> None:
    env = {"TRACKLAKE_RUN_ID": "mine", "TORCHELASTIC_RUN_ID": "te", "SLURM_JOB_ID": "5"}
    assert resolve_run_id(None, "p", "n", env) == "mine"


def test_torchelastic_run_id_is_used_unless_it_is_none() -> None:
    assert resolve_run_id(None, "p", "n", {"TORCHELASTIC_RUN_ID": "abc123",
                                           "SLURM_JOB_ID": "5"}) == "torchelastic-abc123"
    # torchrun's default "none" is not an id: fall through to the next launcher
    assert resolve_run_id(None, "p", "n", {"TORCHELASTIC_RUN_ID": "none",
                                           "SLURM_JOB_ID": "5"}) == "slurm-5"
    assert resolve_run_id(None, "p", "n", {"TORCHELASTIC_RUN_ID": "None",
                                           "SLURM_JOB_ID": "5"}) == "slurm-5"


def test_slurm_job_id_includes_the_array_task_id() -> None:
    assert resolve_run_id(None, "p", "n", {"SLURM_JOB_ID": "77"}) == "slurm-77"
    assert resolve_run_id(None, "p", "n", {"SLURM_JOB_ID": "77",
                                           "SLURM_ARRAY_TASK_ID": "3"}) == "slurm-77_3"


def test_multi_process_job_id_is_a_stable_hash_of_master_address() -> None:
    """WORLD_SIZE > 1 with MASTER_ADDR: every rank computes the same id, and a different
    job (port, project or name) gets a different one."""
    env = {"WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    first = resolve_run_id(None, "proj", "exp", env)
    assert first == resolve_run_id(None, "proj", "exp", dict(env))
    assert re.fullmatch(r"job-[0-9a-f]{16}", first)
    assert first != resolve_run_id(None, "proj", "exp", {**env, "MASTER_PORT": "29501"})
    assert first != resolve_run_id(None, "proj2", "exp", env)
    assert first != resolve_run_id(None, "proj", "exp2", env)


def test_single_process_without_launcher_gets_a_unique_id() -> None:
    env = {"WORLD_SIZE": "1", "MASTER_ADDR": "10.0.0.1"}
    ids = {resolve_run_id(None, "p", "my exp", env) for _ in range(20)}
    assert len(ids) == 20
    assert all(i.startswith("my_exp-") and safe_name(i, "run") == i for i in ids)
    assert resolve_run_id(None, "p", None, {}) != resolve_run_id(None, "p", None, {})


def test_run_id_resolution_through_init_uses_the_environment(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "node0")
    monkeypatch.setenv("MASTER_PORT", "1234")
    a = _init(root, project="p", name="exp", rank=0)
    b = _init(root, project="p", name="exp", rank=1)
    a.finish()
    b.finish()
    assert a.id == b.id and a.id.startswith("job-")
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    c = _init(root, project="p", name="exp", rank=0)
    c.finish()
    assert c.id == "slurm-9"
    monkeypatch.setenv("TRACKLAKE_RUN_ID", "pinned/id")
    d = _init(root, project="p", name="exp", rank=0)
    d.finish()
    assert d.id == "pinned_id"


# -- rank resolution -------------------------------------------------------------------

def test_rank_resolution_order() -> None:
    assert resolve_rank(5, {"RANK": "3", "SLURM_PROCID": "2"}) == 5
    assert resolve_rank(None, {"RANK": "3", "SLURM_PROCID": "2"}) == 3
    assert resolve_rank(None, {"SLURM_PROCID": "2"}) == 2
    assert resolve_rank(None, {"RANK": "", "SLURM_PROCID": "2"}) == 2
    with pytest.raises(ValueError, match="RANK='x' is not a rank"):
        resolve_rank(None, {"RANK": "x"})  # refused: it used to become rank 0
    assert resolve_rank(None, {}) == 0


@pytest.mark.parametrize("bad", [-1, "1", 1.0])
def test_invalid_rank_argument_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="rank must be a non-negative int"):
        resolve_rank(bad, {})  # type: ignore[arg-type]


def test_init_takes_rank_from_the_environment(root: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_PROCID", "4")
    run = _init(root, project="p", run_id="r")
    run.finish()
    assert run.rank == 4
    monkeypatch.setenv("RANK", "2")
    run2 = _init(root, project="p", run_id="r")
    run2.finish()
    assert run2.rank == 2
    assert (root / "runs" / "project=p" / "run=r" / "rank=4" / "attempt=1.json").is_file()
    assert (root / "runs" / "project=p" / "run=r" / "rank=2" / "attempt=1.json").is_file()


# -- attempts --------------------------------------------------------------------------

def test_reinitialising_a_run_on_the_same_rank_is_a_new_attempt(root: Path) -> None:
    """Same run id on the same rank gives attempt 2; another rank starts at attempt 1."""
    first = _init(root, project="p", run_id="job", rank=0)
    first.log({"x": 1.0})
    first.finish()
    second = _init(root, project="p", run_id="job", rank=0)
    other = _init(root, project="p", run_id="job", rank=1)
    second.finish()
    other.finish()
    assert (first.attempt, second.attempt, other.attempt) == (1, 2, 1)
    rank0 = root / "runs" / "project=p" / "run=job" / "rank=0"
    assert sorted(p.name for p in rank0.iterdir()) == ["attempt=1.json", "attempt=2.json"]
    record = tracklake.find_run(root, "job")
    assert record.attempt_numbers == [1, 2] and record.ranks == [0, 1]


def test_the_default_store_directory_never_shadows_the_package(tmp_path: Path) -> None:
    """After a run written with the default root from a directory, a fresh interpreter
    started there still imports the installed package (a store directory named like the
    package would be imported instead, as a namespace package without `init`)."""
    env = {k: v for k, v in os.environ.items() if k != "TRACKLAKE_ROOT"}
    write = ("import tracklake\n"
             "with tracklake.init(project='p', run_id='r', capture_identity=False) as run:\n"
             "    run.log({'x': 1.0}, step=0)\n")
    subprocess.run([sys.executable, "-c", write], cwd=tmp_path, env=env, check=True)
    assert (tmp_path / DEFAULT_ROOT / "runs").is_dir()
    probe = subprocess.run([sys.executable, "-c", "import tracklake; tracklake.init"],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    assert not DEFAULT_ROOT.isidentifier()


def test_the_demo_default_directory_never_shadows_the_package(tmp_path: Path) -> None:
    """`python -m tracklake._cli.demo` writes to its own default root: after a store is
    written there, a fresh interpreter started in that directory still imports tracklake."""
    env = {k: v for k, v in os.environ.items() if k != "TRACKLAKE_ROOT"}
    write = ("import tracklake\n"
             "from tracklake._cli.demo import default_root\n"
             "print(default_root())\n"
             "with tracklake.init(project='p', run_id='r', root=default_root(),\n"
             "                    capture_identity=False) as run:\n"
             "    run.log({'x': 1.0}, step=0)\n")
    done = subprocess.run([sys.executable, "-c", write], cwd=tmp_path, env=env, check=True,
                          capture_output=True, text=True)
    root = tmp_path / done.stdout.strip()
    assert (root / "runs").is_dir() and root.parent == tmp_path
    probe = subprocess.run([sys.executable, "-c", "import tracklake; tracklake.init"],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr


def test_the_default_root_is_relative_to_the_working_directory_unless_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_root(None) == tmp_path / DEFAULT_ROOT
    monkeypatch.setenv("TRACKLAKE_ROOT", str(tmp_path / "elsewhere"))
    assert resolve_root(None) == tmp_path / "elsewhere"
