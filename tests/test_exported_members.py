"""The public surface is exactly what we mean to export."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tracklake
import tracklake.exporters

EXPORTERS = Path(tracklake.exporters.__file__).parent

EXPECTED = {
    "FORMAT_VERSION", "KINDS", "CompactionReport", "Cursor", "CursorError", "ExportError",
    "FinishReport",
    "FormatError", "InvalidNameError", "NewerFormatError", "NoAnswerError", "QueryError",
    "ReadProblems", "Run",
    "RunNotFoundError", "RunRecord", "RunStateError", "Span", "StoreError", "StreamId",
    "Tracking", "TracklakeError", "compact", "connect", "find_run", "init", "list_runs",
    "query", "read_run", "trace",
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
    "Destination", "ExportContext", "ExportOptions", "ExportProgress", "ExportSummary",
    "Exporter",
    "MemoryDestination", "RunInfo", "RunOutcome", "Selection", "available", "export",
    "export_status", "load",
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
        assert Destination in cls.__mro__
        for method in ("cli_options", "from_cli", "describe", "start", "open_run", "write",
                       "commit", "finish_run", "close"):
            assert callable(getattr(cls, method))
        assert isinstance(cls.commit_interval, float)
    assert isinstance(load("memory")(), Destination)


READ_EXPECTED = {
    "FORMAT_VERSION", "KINDS", "PARTITION_SCHEMA", "SCHEMAS", "TERMINAL_STATUSES", "Cursor",
    "ReadProblems",
    "RunRecord", "StreamId", "blob_path", "check_version", "effective_status", "find_run",
    "list_runs", "open_blob", "read_run", "resolve_root", "run_files", "stored_blob",
    "read_exporter_state", "media_file",
    "MAX_STATE_BYTES", "positions_past_end", "stream_last_seq", "AttemptCutoffs",
    "MetricAxes", "MetricRule",
}


def test_read_api_all_is_exactly_the_intended_public_api() -> None:
    import tracklake.files
    import tracklake.read

    assert set(tracklake.read.__all__) == READ_EXPECTED
    for name in tracklake.read.__all__:
        assert getattr(tracklake.read, name) is not None
    assert set(tracklake.files.__all__) == {"fsync_dir", "fsync_file", "write_atomic",
                                            "NotRegularFileError", "open_regular",
                                            "read_regular"}


def private_store_imports(package: Path) -> list[str]:
    """Every import of a private `tracklake._…` module (or of a private name from
    `tracklake`) in the modules under `package`, as "path:line: module"."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("tracklake._"):
                    found.append(f"{path}:{node.lineno}: {name}")
                    break
    return found


def test_exporters_use_only_the_public_read_api() -> None:
    """Destinations and the export loop read the store through `tracklake.read` (and write
    their own files through `tracklake.files`), as a third-party destination must."""
    assert private_store_imports(EXPORTERS) == []


def test_the_private_import_check_finds_a_private_import(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("from tracklake._format import blob_path\n")
    (tmp_path / "good.py").write_text("from tracklake.read import blob_path\n")
    assert private_store_imports(tmp_path) == [
        f"{tmp_path / 'bad.py'}:1: tracklake._format"]
