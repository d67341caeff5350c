"""Keys a destination refuses or changes become legal names, and distinct keys stay
distinct: in MLflow, W&B and SwanLab, read back with their own libraries."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from _optional import optional
from hypothesis import given
from hypothesis import strategies as st

optional("mlflow")  # its key rules are those of the mlflow destination, which needs it

import tracklake
from tracklake.exporters import Selection, export
from tracklake.exporters._shared.keys import DIGITS
from tracklake.exporters.mlflow.names import artifact_part, mlflow_key

#: Keys a careless or hostile user logs: traversal, empty and dot segments, edges,
#: characters some destinations refuse, near-duplicates after cleaning, a very long key.
ODD_KEYS = ["a/../b", "../x", "a//b", "a/b", "/lead", "lead", "trail/", " space", "é.x", "_.x",
            ".x", "x", "a\nb", "a\\b", "a_b", "..", ".", "a/./b", "x@y", "k" * 600,
            "k" * 599 + "j"]


def _mappings() -> dict[str, Callable[[str], str]]:
    found: dict[str, Callable[[str], str]] = {"mlflow": mlflow_key,
                                              "mlflow artifact": artifact_part}
    optional("wandb")
    from tracklake.exporters.wandb.rows import table_key

    found["wandb table"] = table_key
    optional("swanlab")
    from tracklake.exporters.swanlab.records import swanlab_key

    found["swanlab"] = swanlab_key
    return found


MAPPINGS = _mappings()


@pytest.mark.parametrize("name", sorted(MAPPINGS))
def test_odd_keys_get_distinct_legal_names(name: str) -> None:
    mapping = MAPPINGS[name]
    names = [mapping(k) for k in ODD_KEYS]
    assert len(set(names)) == len(ODD_KEYS), name
    for key, mapped in zip(ODD_KEYS, names, strict=True):
        if not _verl_at(name, mapped):
            assert mapping(mapped) == mapped, (key, mapped)  # a name is taken as it is
    assert mapping("actor/pg_loss") == "actor/pg_loss"  # an ordinary key is untouched


@pytest.mark.parametrize("name", sorted(MAPPINGS))
@given(keys=st.sets(st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
                    | st.text(alphabet="a./\\ _-~", max_size=12), min_size=2, max_size=20))
def test_distinct_keys_never_share_a_name(name: str, keys: set[str]) -> None:
    mapping = MAPPINGS[name]
    names = {mapping(k) for k in keys}
    assert len(names) == len(keys)
    for mapped in names:
        if not _verl_at(name, mapped):
            assert mapping(mapped) == mapped
        assert len(mapped) <= 600


def _verl_at(mapping: str, mapped: str) -> bool:
    """MLflow names holding verl's ``_at_`` belong to the ``@`` key (`mlflow_key`), so
    such a name given as a key gets a hash instead of being taken as it is."""
    return mapping == "mlflow" and "_at_" in mapped


def _log_odd_keys(root: Path) -> None:
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False) as run:
        for step, key in enumerate(ODD_KEYS):
            run.log({key: float(step)}, step=step)
            run.log_text(key, f"text {step}", step=step)
            run.log_generations([{"input": "q", "output": "a", "score": 1.0}], step=step,
                                key=key)


@pytest.mark.filterwarnings(  # MLflow's SQL store on SQLAlchemy 2.1 (as in test_mlflow.py)
    "ignore:The ``noload`` loader strategy is deprecated")
def test_mlflow_keeps_every_odd_key_apart(root: Path, tmp_path: Path) -> None:
    optional("mlflow")
    from mlflow.tracking import MlflowClient

    from tracklake.exporters.mlflow import MlflowDestination

    _log_odd_keys(root)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    summary = export(MlflowDestination(tracking_uri=uri, artifact_root=str(tmp_path / "art")),
                     root=root, selection=Selection(all_runs=True))
    assert not summary.failed, str(summary)
    client = MlflowClient(uri)
    (found,) = client.search_runs([client.get_experiment_by_name("p").experiment_id])
    assert len(found.data.metrics) == len(ODD_KEYS)
    assert {mlflow_key(k) for k in ODD_KEYS} == set(found.data.metrics)


def test_wandb_exports_tables_under_odd_keys(root: Path, tmp_path: Path) -> None:
    optional("wandb")
    import _wandb_log as wlog

    from tracklake.exporters.wandb import WandbDestination

    _log_odd_keys(root)
    summary = export(WandbDestination(dir=str(tmp_path / "out")), root=root,
                     selection=Selection(all_runs=True))
    assert not summary.failed, str(summary)
    files = sorted((tmp_path / "out").rglob("*.wandb"))
    tables = set()
    for _step, row in wlog.history(files):
        tables.update(k for k, v in _leaves(row) if isinstance(v, dict)
                      and v.get("_type") == "table-file")
    texts = {k for k in tables if k.startswith("texts/")}
    generations = {k for k in tables if k.startswith("generations/")}
    assert len(texts) == len(generations) == len(ODD_KEYS)


def _leaves(row: dict[str, object], prefix: str = "") -> list[tuple[str, object]]:
    """(key, value) of a W&B history row, nested dicts flattened with ``/`` except tables."""
    out: list[tuple[str, object]] = []
    for key, value in row.items():
        if isinstance(value, dict) and "_type" not in value:
            out.extend(_leaves(value, f"{prefix}{key}/"))
        else:
            out.append((f"{prefix}{key}", value))
    return out


def test_swanlab_keeps_every_odd_key_apart(root: Path, tmp_path: Path) -> None:
    optional("swanlab")
    import _swanlab_log as slog

    from tracklake.exporters.swanlab import SwanlabDestination

    _log_odd_keys(root)
    summary = export(SwanlabDestination(logdir=str(tmp_path / "swanlog")), root=root,
                     selection=Selection(all_runs=True))
    assert not summary.failed, str(summary)
    directories = [d for d in (tmp_path / "swanlog").iterdir() if d.is_dir()]
    keys = {key for _step, key, _value in slog.points(directories)}
    assert len(keys) == len(ODD_KEYS)


def test_a_changed_key_carries_a_hash_of_the_original() -> None:
    assert mlflow_key("a/../b").startswith("a/__/b-") and len(mlflow_key("a/../b")) == len(
        "a/__/b-") + DIGITS
