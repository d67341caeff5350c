"""Histogram records to TensorBoard histogram events (``HistogramProto``, what
`tf.summary.histogram`'s legacy form and tensorboardX write; TensorBoard's histogram and
distribution dashboards read it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from tensorboard.compat.proto import (  # type: ignore[import-untyped, unused-ignore]
    event_pb2,
    summary_pb2,
)


def histogram_proto(edges: list[float], counts: list[int], mean: float | None,
                    std: float | None) -> Any:
    """A `HistogramProto` of the bins: `bucket_limit[i]` is bin i's right edge, and `min`
    and `max` the outer edges, so that TensorBoard's reading of it (each bin from the
    previous limit, the first from `min`, the last to `max`) gives back exactly these
    bins. `sum` and `sum_squares` come from the mean and std of the binned values."""
    num = float(sum(counts))
    mean = 0.0 if mean is None or mean != mean else mean
    std = 0.0 if std is None or std != std else std
    return summary_pb2.HistogramProto(
        min=edges[0], max=edges[-1], num=num, sum=mean * num,
        sum_squares=num * (std * std + mean * mean), bucket_limit=edges[1:],
        bucket=[float(c) for c in counts])


def histogram_events(records: pa.Table) -> Iterator[Any]:
    """One event per histogram record with bins (one of only NaN/inf values has none: its
    statistics went as scalars)."""
    times = records.column("time").cast(pa.int64()).to_pylist()
    for step, key, edges, counts, mean, std, t in zip(
            records.column("step").to_pylist(), records.column("key").to_pylist(),
            records.column("edges").to_pylist(), records.column("counts").to_pylist(),
            records.column("mean").to_pylist(), records.column("std").to_pylist(), times,
            strict=True):
        if not edges:
            continue
        value = summary_pb2.Summary.Value(tag=key, histo=histogram_proto(edges, counts, mean,
                                                                         std))
        yield event_pb2.Event(wall_time=t / 1_000_000, step=0 if step is None else step,
                              summary=summary_pb2.Summary(value=[value]))
