"""Rank modes: rank 0 only, every rank under a ``rank{r}/`` prefix, or an aggregate
(mean, min, max) of each metric across ranks per step."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracklake.read import SCHEMAS, AttemptCutoffs, StreamId

AGGREGATES = ("mean", "min", "max")
RANK_MODES = ("0", "all", *AGGREGATES)  # or any rank number
#: Kinds whose keys get the rank prefix in "all" mode.
PREFIXED_KINDS = ("metrics", "texts", "histograms", "media")


def check_mode(mode: str) -> str:
    if mode in RANK_MODES or mode.isdigit():
        return mode
    raise ValueError(f"rank mode must be a rank number, 'all', 'mean', 'min' or 'max', "
                     f"not {mode!r}")


def ranks_to_read(mode: str) -> tuple[int, ...] | None:
    """The ranks whose streams the mode reads (None: all of them)."""
    return (int(mode),) if mode.isdigit() else None


def with_rank(stream: StreamId, batch: pa.RecordBatch, mode: str) -> pa.Table | None:
    """A batch as the destination gets it: ``rank`` and ``attempt`` columns added, keys
    prefixed in "all" mode. None for batches the mode does not pass through (metrics of
    an aggregate mode go through `Aggregator`; other kinds come from rank 0 only)."""
    if mode in AGGREGATES and (stream.kind == "metrics" or stream.rank != 0):
        return None
    table = pa.Table.from_batches([batch])
    n = table.num_rows
    if mode == "all" and stream.kind in PREFIXED_KINDS:
        keys = pc.binary_join_element_wise(f"rank{stream.rank}", table.column("key"), "/")
        table = table.set_column(table.schema.get_field_index("key"), "key", keys)
    return table.append_column("rank", pa.array([stream.rank] * n, pa.int32())).append_column(
        "attempt", pa.array([stream.attempt] * n, pa.int32()))


class Aggregator:
    """Holds each (step, key) until every rank has logged it (or the run is over), then
    emits the mean, min or max of each rank's latest attempt, as the attempt of the latest
    of them. What it holds is saved in the exporter state, so a restarted exporter loses
    nothing it had read."""

    def __init__(self, mode: str, held: dict[str, Any]) -> None:
        self.mode = mode
        # held[str(step)][key][str(rank)] = [value, time_us, attempt]
        self.held: dict[str, dict[str, dict[str, list[Any]]]] = held

    def add(self, stream: StreamId, batch: pa.RecordBatch) -> None:
        times = batch.column("time").cast(pa.int64()).to_pylist()
        for step, key, value, t in zip(batch.column("step").to_pylist(),
                                       batch.column("key").to_pylist(),
                                       batch.column("value").to_pylist(), times, strict=True):
            by_rank = self.held.setdefault(str(step), {}).setdefault(key, {})
            held = by_rank.get(str(stream.rank))
            if held is None or held[2] <= stream.attempt:
                by_rank[str(stream.rank)] = [value, t, stream.attempt]

    def drop_superseded(self, cutoffs: AttemptCutoffs) -> None:
        """Forget what is held of an attempt that a later one has superseded at its step."""
        for step in list(self.held):
            keys = self.held[step]
            for key in list(keys):
                by_rank = keys[key]
                for rank, (_, _, attempt) in list(by_rank.items()):
                    cut = cutoffs.cutoff(int(rank), attempt)
                    if cut is not None and int(step) >= cut:
                        del by_rank[rank]
                if not by_rank:
                    del keys[key]
            if not keys:
                del self.held[step]

    def ready(self, ranks: tuple[int, ...], everything: bool) -> pa.Table | None:
        """The aggregates of steps every rank in `ranks` has logged (all of them if
        `everything`), removed from what is held."""
        want = {str(r) for r in ranks}
        rows: dict[str, list[Any]] = {"seq": [], "time": [], "step": [], "key": [], "value": [],
                                      "attempt": []}
        for step in sorted(self.held, key=int):
            keys = self.held[step]
            for key in list(keys):
                by_rank = keys[key]
                if not everything and not want <= set(by_rank):
                    continue
                values = [v[0] for v in by_rank.values()]
                rows["seq"].append(-1)
                rows["time"].append(max(v[1] for v in by_rank.values()))
                rows["step"].append(int(step))
                rows["key"].append(key)
                rows["value"].append(_aggregate(self.mode, values))
                rows["attempt"].append(max(v[2] for v in by_rank.values()))
                del keys[key]
            if not keys:
                del self.held[step]
        if not rows["key"]:
            return None
        schema = SCHEMAS["metrics"]
        table = pa.table({
            "seq": pa.array(rows["seq"], pa.int64()),
            "time": pa.array(rows["time"], pa.int64()).cast(schema.field("time").type),
            "step": pa.array(rows["step"], pa.int64()),
            "key": pa.array(rows["key"], pa.string()),
            "value": pa.array(rows["value"], pa.float64()),
        })
        n = table.num_rows
        return table.append_column("rank", pa.nulls(n, pa.int32())).append_column(
            "attempt", pa.array(rows["attempt"], pa.int32()))


def _aggregate(mode: str, values: list[float]) -> float:
    if any(math.isnan(v) for v in values):
        return math.nan
    if mode == "min":
        return min(values)
    if mode == "max":
        return max(values)
    return math.fsum(values) / len(values)
