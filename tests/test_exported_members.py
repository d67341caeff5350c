"""The public surface is exactly what we mean to export."""

from __future__ import annotations

import subprocess
import sys

import tracklake
import tracklake.exporters

EXPECTED = {
    "FORMAT_VERSION", "KINDS", "CompactionReport", "Cursor", "CursorError", "ExportError",
    "FinishReport",
    "FormatError", "InvalidNameError", "NewerFormatError", "QueryError", "ReadProblems", "Run",
    "RunNotFoundError", "RunRecord", "RunStateError", "Span", "StoreError", "StreamId",
    "Tracking", "TracklakeError", "compact", "connect", "find_run", "init", "list_runs",
    "query", "read_run",
}


def test_all_is_exactly_the_intended_public_api() -> None:
    assert set(tracklake.__all__) == EXPECTED
    assert len(tracklake.__all__) == len(EXPECTED)


def test_every_exported_name_resolves_and_none_is_private() -> None:
    for name in tracklake.__all__:
        member = getattr(tracklake, name)
        assert member is not None
        module = getattr(member, "__module__", "tracklake")
        assert module.startswith("tracklake"), (name, module)


def test_errors_share_one_root() -> None:
    for name in tracklake.__all__:
        member = getattr(tracklake, name)
        if isinstance(member, type) and issubclass(member, Exception):
            assert issubclass(member, tracklake.TracklakeError), name


def test_import_loads_neither_duckdb_nor_torch_nor_destination_sdks() -> None:
    code = ("import sys, tracklake, tracklake.exporters; "
            "print(sorted(m for m in ('duckdb', 'torch', 'wandb', 'mlflow', 'swanlab', "
            "'tensorboard') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


EXPORTERS_EXPECTED = {
    "Destination", "ExportOptions", "ExportSummary", "Exporter", "MemoryDestination",
    "RunInfo", "RunOutcome", "Selection", "available", "export", "export_status", "load",
}


def test_exporters_all_is_exactly_the_intended_public_api() -> None:
    assert set(tracklake.exporters.__all__) == EXPORTERS_EXPECTED
    for name in tracklake.exporters.__all__:
        assert getattr(tracklake.exporters, name) is not None


def test_built_in_destinations_are_registered_and_satisfy_the_protocol() -> None:
    from tracklake.exporters import Destination, available, load

    assert {"console", "memory", "tensorboard", "mlflow"} <= set(available())
    for name in ("console", "memory", "tensorboard", "mlflow"):
        cls = load(name)
        assert cls.name == name
        for method in ("open_run", "write", "commit", "finish_run", "close"):
            assert callable(getattr(cls, method))
    assert isinstance(load("memory")(), Destination)
