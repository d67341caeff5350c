"""The opt-in that serves frameworks' own ``import wandb`` from tracklake.wandb:
``TRACKLAKE_WANDB=1`` (through ``tracklake-wandb.pth``, read at interpreter start-up, so
children inherit it) and `tracklake.integrations.wandb.install()`. Each test runs a fresh
interpreter; without the opt-in, ``import wandb`` is the real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest
from _env import child_env
from _optional import optional

import tracklake

REPO = Path(__file__).resolve().parents[2]
PTH = "tracklake-wandb.pth"


def _python(code: str, *, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 300) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          env=env or child_env(), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _env(root: Path, **more: str) -> dict[str, str]:
    return {**child_env(), "TRACKLAKE_ROOT": str(root), **more}


@pytest.mark.parametrize("value", [None, "0", ""])
def test_without_the_opt_in_import_wandb_is_the_real_wandb(value: str | None,
                                                          root: Path) -> None:
    optional("wandb")
    env = _env(root) if value is None else _env(root, TRACKLAKE_WANDB=value)
    out = _python("import wandb, sys; print(wandb.__file__); "
                  "print('tracklake' in sys.modules)", env=env)
    file, tracklake_loaded = out.split()
    assert Path(file).parent.name == "wandb" and file.endswith("__init__.py")
    assert tracklake_loaded == "False"  # the .pth imports nothing without the variable


def test_the_variable_serves_import_wandb_in_a_process_and_in_its_children(
        root: Path) -> None:
    """A script that imports wandb logs to the store, and so does a child it starts (as
    torchrun and Ray start workers): rank 0 and rank 1 of one run."""
    child = textwrap.dedent("""
        import wandb
        run = wandb.init(project="optin", id="job-1")
        wandb.log({"loss": 0.5}, step=3)
        wandb.finish()
    """)
    out = _python(f"""
        import os, subprocess, sys
        import wandb
        print(type(wandb).__module__, wandb.run)
        run = wandb.init(project="optin", id="job-1", config={{"lr": 0.1}})
        wandb.log({{"loss": 1.0}}, step=3)
        subprocess.run([sys.executable, "-c", {child!r}], env={{**os.environ, "RANK": "1"}},
                       check=True)
        wandb.finish()
    """, env=_env(root, TRACKLAKE_WANDB="1"))
    assert out.split() == ["tracklake._integrations.wandb.alias", "None"]
    rows = tracklake.query("SELECT rank, step, key, value FROM metrics ORDER BY rank",
                           root=root).to_pylist()
    assert rows == [{"rank": 0, "step": 3, "key": "loss", "value": 1.0},
                    {"rank": 1, "step": 3, "key": "loss", "value": 0.5}]


def test_install_serves_later_imports_and_uninstall_gives_the_real_one_back(
        root: Path) -> None:
    optional("wandb")
    out = _python("""
        from tracklake.integrations import wandb as optin
        assert set(optin.__all__) == {"ENV", "install", "installed", "uninstall"}
        assert not optin.installed()
        optin.install()
        import wandb
        from wandb.sdk.lib.config_util import ConfigError
        from wandb.errors import Error
        import tracklake.wandb as ours
        print(wandb.init is ours.init, ConfigError is ours.ConfigError, Error is ours.Error)
        try:
            import wandb.apis
        except ModuleNotFoundError as exc:
            print("refused:", "tracklake.wandb" in str(exc))
        optin.uninstall()
        import wandb as real
        print(real.init is ours.init, real.__file__.endswith("__init__.py"))
    """, env=_env(root))
    assert out.splitlines() == ["True True True", "refused: True", "False True"]


def test_install_after_the_real_wandb_was_imported_says_so(root: Path) -> None:
    optional("wandb")
    out = _python("""
        import warnings
        import wandb as real
        from tracklake.integrations import wandb as optin
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            optin.install()
        import wandb
        print(wandb is not real, ["the real wandb was imported before" in str(w.message)
                                  for w in caught])
    """, env=_env(root))
    assert out.strip() == "True [True]"


def test_transformers_own_wandb_callback_writes_into_the_store(root: Path,
                                                              tmp_path: Path) -> None:
    """``report_to="wandb"`` with TRACKLAKE_WANDB=1: transformers' WandbCallback (its
    config, define_metric axis, per-step logs, eval logs and summary scalars) ends in the
    store, and the real wandb is never imported."""
    optional("transformers")
    optional("torch")
    out = _python(f"""
        import sys, torch
        from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

        class Data(torch.utils.data.Dataset):
            def __len__(self):
                return 16

            def __getitem__(self, i):
                ids = torch.tensor([(i + j) % 64 for j in range(8)])
                return {{"input_ids": ids, "labels": ids}}

        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=64,
                                           n_positions=16))
        args = TrainingArguments(output_dir={str(tmp_path / "out")!r}, report_to="wandb",
                                 max_steps=4, logging_steps=1, per_device_train_batch_size=4,
                                 use_cpu=True, save_strategy="no", eval_strategy="steps",
                                 eval_steps=2, run_name="tiny", disable_tqdm=True)
        Trainer(model=model, args=args, train_dataset=Data(), eval_dataset=Data()).train()
        print(sorted(m for m in sys.modules if m.startswith("wandb.") and
                     not m.startswith(("wandb.sdk.lib.config_util", "wandb.sdk.lib",
                                       "wandb.sdk"))))
    """, env=_env(root, TRACKLAKE_WANDB="1", WANDB_PROJECT="hf"))
    assert out.strip().splitlines()[-1] == "[]"
    (run,) = tracklake.list_runs(root=root)
    assert run.project == "hf"
    metrics = tracklake.query("SELECT DISTINCT step, key FROM metrics", root=root).to_pylist()
    steps = {(r["step"], r["key"]) for r in metrics}
    assert {(s, "train/loss") for s in range(1, 5)} <= steps
    assert {(2, "eval/loss"), (4, "eval/loss")} <= steps
    configs = {r["key"]: json.loads(r["value"]) for r in tracklake.query(
        "SELECT key, value FROM configs", root=root).to_pylist()}
    assert configs["learning_rate"] == 5e-05 and configs["model/num_parameters"] > 0
    assert configs["id2label/0"] == "LABEL_0"  # int keys of the model config, as str
    events = tracklake.query("SELECT kind, title, text FROM events", root=root).to_pylist()
    rules = [(e["title"], json.loads(e["text"])) for e in events
             if e["kind"] == "wandb.define_metric"]
    assert rules == [("train/global_step", {}),
                     ("*", {"step_metric": "train/global_step", "step_sync": True})]
    summary = {k for e in events if e["kind"] == "wandb.summary" for k in json.loads(e["text"])}
    assert {"train_runtime", "train_loss", "total_flos"} <= summary
    status = tracklake.query("SELECT status FROM runs", root=root).to_pylist()
    assert status == [{"status": "finished"}]


def test_verls_own_wandb_backend_and_generations_logger_write_into_the_store(
        root: Path) -> None:
    """verl's `Tracking` with the ``wandb`` backend and its `ValidationGenerationsLogger`
    (verl's code, importing wandb itself) with TRACKLAKE_WANDB=1."""
    optional("verl")
    out = _python("""
        from verl.utils.tracking import Tracking, ValidationGenerationsLogger
        tracking = Tracking(project_name="proj", experiment_name="exp",
                            default_backend=["wandb"],
                            config={"lr": 0.1, "trainer": {"wandb_proxy": None}})
        generations = ValidationGenerationsLogger("proj", "exp")
        for step in (1, 2):
            tracking.log({"actor/loss": 1.0 / step}, step=step)
            generations.log(["wandb"], [("in", f"out{step}", 1.0)], step)
        import wandb
        print(type(wandb).__module__)
        wandb.finish()
    """, env=_env(root, TRACKLAKE_WANDB="1"))
    assert out.split()[-1] == "tracklake._integrations.wandb.alias"
    assert tracklake.query("SELECT step, key, value FROM metrics ORDER BY step",
                           root=root).to_pylist() == [
        {"step": 1, "key": "actor/loss", "value": 1.0},
        {"step": 2, "key": "actor/loss", "value": 0.5}]
    rows = tracklake.query("SELECT step, extra FROM generations WHERE key = 'val/generations' "
                           "ORDER BY step, sample", root=root).to_pylist()
    # verl logs its whole table at each step: row 1 again at step 2, then row 2
    assert [(r["step"], json.loads(r["extra"])["output_1"]) for r in rows] == [
        (1, "out1"), (2, "out1"), (2, "out2")]


def test_accelerates_own_wandb_tracker_writes_into_the_store(root: Path) -> None:
    """accelerate's `WandBTracker` (config, metrics, a table and images at one step)."""
    optional("accelerate")
    _python("""
        import numpy as np
        from accelerate import PartialState
        from accelerate.tracking import WandBTracker

        PartialState(cpu=True)
        tracker = WandBTracker("accproj", name="acc-run")
        tracker.start()
        tracker.store_init_configuration({"lr": 0.1, "nested": {"a": 1}})
        for step in range(3):
            tracker.log({"loss": 1.0 / (step + 1)}, step=step)
        tracker.log_table("samples", columns=["prompt", "completion"], data=[["q", "a"]],
                          step=2)
        tracker.log_images({"imgs": [np.zeros((4, 4, 3), dtype=np.uint8)]}, step=2)
        tracker.finish()
    """, env=_env(root, TRACKLAKE_WANDB="1"))
    (run,) = tracklake.list_runs(root=root)
    assert run.project == "accproj"
    assert [r["step"] for r in tracklake.query("SELECT step FROM metrics ORDER BY step",
                                               root=root).to_pylist()] == [0, 1, 2]
    assert tracklake.query("SELECT step, input, output FROM generations",
                           root=root).to_pylist() == [{"step": 2, "input": "q", "output": "a"}]
    assert tracklake.query("SELECT step, key, media_type, shape FROM media",
                           root=root).to_pylist() == [
        {"step": 2, "key": "imgs", "media_type": "image/png", "shape": [4, 4, 3]}]
    configs = tracklake.query("SELECT key FROM configs ORDER BY key", root=root).to_pylist()
    assert configs == [{"key": "lr"}, {"key": "nested/a"}]


@pytest.mark.slow
def test_ray_workers_inherit_the_opt_in_from_the_driver(root: Path) -> None:
    """Ray's workers (started by the raylet that ray.init starts) inherit the driver's
    environment: two tasks that import wandb write ranks of one shared-mode run."""
    optional("ray")
    out = _python("""
        import tempfile, warnings
        import ray
        warnings.simplefilter("ignore")  # Ray's own notices at start
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
                 _temp_dir=tempfile.mkdtemp(prefix="ray", dir="/tmp"),
                 object_store_memory=80 << 20, configure_logging=False)

        @ray.remote(num_cpus=0)
        def work(rank):
            import wandb
            wandb.init(project="ray", id="ray-job", settings=wandb.Settings(
                mode="shared", x_primary=False, x_label=f"rank_{rank}"))
            wandb.log({"loss": 1.0 + rank}, step=1)
            wandb.finish()
            return type(wandb).__module__

        print(sorted(set(ray.get([work.remote(1), work.remote(2)]))))
        ray.shutdown()
    """, env=_env(root, TRACKLAKE_WANDB="1"))
    assert out.strip().splitlines()[-1] == "['tracklake._integrations.wandb.alias']"
    assert tracklake.query("SELECT rank, value FROM metrics ORDER BY rank",
                           root=root).to_pylist() == [{"rank": 1, "value": 2.0},
                                                      {"rank": 2, "value": 3.0}]


def test_the_editable_install_has_the_pth_file_in_site_packages() -> None:
    installed = Path(sysconfig.get_paths()["purelib"]) / PTH
    assert installed.read_text() == (REPO / "store/_integrations/wandb" / PTH).read_text()


@pytest.mark.slow
def test_a_wheel_carries_the_pth_file_at_the_top_of_site_packages(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(tmp_path), str(REPO)],
                   check=True, capture_output=True, timeout=600,
                   env={**os.environ, "PIP_NO_INDEX": "1"}, cwd=tmp_path)
    (wheel,) = tmp_path.glob("tracklake-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert PTH in z.namelist()
        assert z.read(PTH).decode() == (REPO / "store/_integrations/wandb" / PTH).read_text()
