"""A histogram of an array or tensor: bin edges, counts and summary statistics, computed in
the caller's process (docs/concepts.md, "Histograms"), without importing torch."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracklake._format.records import MAX_BINS  # W&B's limit; readers refuse more

#: Bins when none are given.
DEFAULT_BINS = 64
#: The summary statistics also logged as metrics, as ``<key>/<name>``.
SUMMARY = ("count", "min", "max", "mean", "std")


@dataclass(frozen=True)
class Histogram:
    """One histogram record: `counts[i]` values lie in `[edges[i], edges[i + 1])` (the last
    bin includes its right edge); statistics over the finite values."""

    count: int
    nonfinite: int
    min: float
    max: float
    mean: float
    std: float
    edges: list[float]
    counts: Any  # a NumPy int64 array, one value fewer than `edges`

    def row(self, key: str, step: int, time_us: int) -> dict[str, Any]:
        return {"time": time_us, "step": step, "key": key, "count": self.count,
                "nonfinite": self.nonfinite, "min": self.min, "max": self.max,
                "mean": self.mean, "std": self.std, "edges": self.edges,
                "counts": self.counts}

    def summary(self, key: str) -> dict[str, float]:
        """The statistics as metrics: ``<key>/count``, ``/min``, ``/max``, ``/mean``, ``/std``."""
        return {f"{key}/{name}": float(getattr(self, name)) for name in SUMMARY}


def is_array(value: object) -> bool:
    """True if `value` is an array or tensor of more than one element (what
    ``log(..., histograms=True)`` turns into a histogram)."""
    np_mod = sys.modules.get("numpy")
    if np_mod is not None and isinstance(value, np_mod.ndarray):
        return bool(value.size > 1)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return bool(value.numel() > 1)
    if hasattr(value, "__array__") or callable(getattr(value, "numpy", None)):
        shape = getattr(value, "shape", None)
        return isinstance(shape, tuple) and int(np.prod(shape)) > 1
    return False


def as_array(key: str, values: object) -> Any:
    """`values` (a NumPy array, a torch tensor on any device, an object with ``.numpy()`` or
    ``__array__``, a sequence of numbers) as a flat float64 NumPy array."""
    torch = sys.modules.get("torch")  # never imported here: without it, no tensor exists
    if torch is not None and isinstance(values, torch.Tensor):
        tensor: Any = values
        if tensor.is_complex():
            raise TypeError(f"histogram {key!r}: a complex tensor has no histogram")
        values = tensor.detach().to(device="cpu", dtype=torch.float64).numpy()
    elif not isinstance(values, np.ndarray) and callable(getattr(values, "numpy", None)):
        values = values.numpy()  # type: ignore[attr-defined]  # TensorFlow, JAX, ...
    if isinstance(values, (str, bytes)) or not (
            isinstance(values, (np.ndarray, Sequence)) or hasattr(values, "__array__")):
        raise TypeError(f"histogram {key!r}: {type(values).__qualname__} is not an array, a "
                        "tensor or a sequence of numbers")
    try:
        array = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"histogram {key!r}: cannot be read as an array ({exc})") from exc
    if array.dtype.kind not in "biuf":
        raise TypeError(f"histogram {key!r}: values of dtype {array.dtype} are not real numbers")
    return array.astype(np.float64, copy=False).reshape(-1)


def check_bins(key: str, bins: object) -> int | Any:
    """`bins` as a count (1..MAX_BINS) or as edges (finite, increasing, 2..MAX_BINS + 1)."""
    if isinstance(bins, bool):
        raise TypeError(f"histogram {key!r}: bins must be an int or a sequence of edges")
    if isinstance(bins, int):
        if not 1 <= bins <= MAX_BINS:
            raise ValueError(f"histogram {key!r}: {bins} bins; give 1 to {MAX_BINS}")
        return bins
    edges = as_array(f"{key}.bins", bins)
    if not 2 <= len(edges) <= MAX_BINS + 1:
        raise ValueError(f"histogram {key!r}: {len(edges)} edges; give 2 to {MAX_BINS + 1}")
    if not (np.all(np.isfinite(edges)) and np.all(np.diff(edges) > 0)):
        raise ValueError(f"histogram {key!r}: bin edges must be finite and increasing")
    return edges


def histogram(key: str, values: object, bins: object = DEFAULT_BINS) -> Histogram:
    """The histogram of `values` (NaN and ±inf are counted in `nonfinite`, not binned)."""
    checked = check_bins(key, bins)
    array = as_array(key, values)
    if array.size == 0:
        raise ValueError(f"histogram {key!r}: no values")
    finite = array[np.isfinite(array)]
    nonfinite = int(array.size - finite.size)
    if finite.size == 0:
        nan = float("nan")
        return Histogram(0, nonfinite, nan, nan, nan, nan, [], np.zeros(0, np.int64))
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # a too wide range: checked below
            counts, edges = np.histogram(finite, bins=checked)
    except ValueError as exc:  # a range too wide for float64 (max - min overflows)
        raise ValueError(f"histogram {key!r}: {exc}; give the bin edges") from exc
    if not np.all(np.isfinite(edges)):
        raise ValueError(f"histogram {key!r}: values from {finite.min()} to {finite.max()} "
                         "span more than float64 holds; give the bin edges")
    with np.errstate(over="ignore", invalid="ignore"):
        mean, std = float(finite.mean()), float(finite.std())
    return Histogram(int(finite.size), nonfinite, float(finite.min()), float(finite.max()),
                     mean, std, [float(e) for e in edges], counts.astype(np.int64))


def binned(key: str, counts: object, edges: object) -> Histogram:
    """A histogram already binned (``numpy.histogram``'s ``(counts, edges)``, W&B's
    ``np_histogram``): its statistics from the bin midpoints weighted by the counts, its
    range the outer edges."""
    checked = check_bins(key, edges)
    if isinstance(checked, int):
        raise TypeError(f"histogram {key!r}: with counts, bins must be the bin edges")
    array = as_array(f"{key}.counts", counts)
    if len(array) != len(checked) - 1:
        raise ValueError(f"histogram {key!r}: {len(array)} counts for {len(checked)} edges; "
                         "give one count fewer than edges")
    if not (np.all(np.isfinite(array)) and np.all(array >= 0)
            and np.all(array == np.floor(array))):
        raise ValueError(f"histogram {key!r}: counts must be whole numbers, not negative")
    whole = array.astype(np.int64)
    total = int(whole.sum())
    edges_list = [float(e) for e in checked]
    if total == 0:
        nan = float("nan")
        return Histogram(0, 0, nan, nan, nan, nan, edges_list, whole)
    mids = (checked[:-1] + checked[1:]) / 2
    mean = float(np.average(mids, weights=whole))
    std = float(np.sqrt(np.average((mids - mean) ** 2, weights=whole)))
    return Histogram(total, 0, edges_list[0], edges_list[-1], mean, std, edges_list, whole)
