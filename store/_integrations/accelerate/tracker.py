"""`TracklakeTracker`: what ``Accelerator.log`` and ``init_trackers`` send, written to
the store by the main process (by every process, as ranks, with ``all_processes``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from accelerate.state import PartialState
from accelerate.tracking import GeneralTracker, on_main_process, register_tracker_class

from tracklake._integrations.tables import generation_samples
from tracklake._write.coerce import jsonable
from tracklake._write.run import Run, init
from tracklake._write.tracking import StoreBackend


class TracklakeTracker(GeneralTracker):
    """``Accelerator(log_with="tracklake")`` (once this module's public face was imported)
    or ``log_with=[TracklakeTracker(project=...)]``.

    By name, accelerate passes ``init_trackers``'s project as the first argument and
    ``init_kwargs["tracklake"]`` as keywords: `name`, `run_id`, `root`, `tags`, `export`
    are `tracklake.init`'s. The run starts in `start()`, never in the constructor (which
    must not touch the process group)."""

    name = "tracklake"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, *, project: str | None = None,
                 name: str | None = None, run_id: str | None = None, root: str | None = None,
                 tags: Sequence[str] | None = None,
                 export: Sequence[str] | Mapping[str, Any] | None = None,
                 all_processes: bool = False) -> None:
        super().__init__()
        project = project or run_name
        if not project:
            raise ValueError("TracklakeTracker needs a project: TracklakeTracker(project=...) "
                             "or init_trackers(project_name)")
        self.main_process_only = not all_processes
        self._options: dict[str, Any] = {"project": project, "name": name, "run_id": run_id,
                                         "root": root, "tags": tags, "export": export}
        self._store: StoreBackend | None = None

    @property
    def tracker(self) -> Run | None:
        """The run, once started."""
        return self._store.run if self._store is not None else None

    def _run(self) -> StoreBackend:
        if self._store is None:
            self.start()
        assert self._store is not None
        return self._store

    @on_main_process
    def start(self) -> None:
        if self._store is None:
            run = init(rank=PartialState().process_index, **self._options)
            self._store = StoreBackend(run)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._run().run.log_config(jsonable(values))

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self._run().log(values, step)

    @on_main_process
    def log_table(self, table_name: str, columns: Sequence[str] | None = None,
                  data: Sequence[Sequence[Any]] | None = None, dataframe: Any = None,
                  step: int | None = None, **kwargs: Any) -> None:
        """A table (columns and rows, or a pandas DataFrame) as generations under
        `table_name`: prompt/input, completion/output/response and score/reward columns
        mapped, the others kept in each sample's extra fields."""
        if dataframe is not None:
            columns, data = list(dataframe.columns), dataframe.itertuples(index=False)
        if columns is None or data is None:
            raise ValueError(f"log_table({table_name!r}) needs columns and data, or a dataframe")
        self._run().run.log_generations(generation_samples(columns, list(data)), step=step,
                                        key=table_name)

    @on_main_process
    def finish(self) -> None:
        store, self._store = self._store, None
        if store is not None and not store.run.finished:
            store.finish("finished")


def register() -> None:
    """Make ``log_with="tracklake"`` name this tracker, in this process."""
    register_tracker_class(TracklakeTracker)
