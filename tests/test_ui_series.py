"""The dashboard's curves: downsampled per pixel bucket on the server without hiding an
extreme or a non-finite value, refined on zoom, per rank, as a mean with its band, and
on each x axis."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import tracklake
from tracklake._ui.answers import series
from tracklake._ui.series import SeriesQuery

N = 20_000


def write(root: Path) -> None:
    values = np.sin(np.arange(N) / 500.0)
    values[7_777] = 50.0  # one spike among many points
    values[12_345] = -50.0
    values[3_000], values[4_000], values[5_000] = math.nan, math.inf, -math.inf
    for rank in (0, 1):
        with tracklake.init(project="p", run_id="big", root=root, rank=rank) as run:
            for step in range(N):
                run.log({"x": float(values[step]) + rank}, step=step)


def test_downsampling_keeps_extremes_and_non_finite_values(root: Path) -> None:
    write(root)
    curve, = series(root, SeriesQuery(key="x", runs=(("p", "big"),), buckets=100))["curves"]
    assert curve["points"] == N and len(curve["x"]) <= 2 * 100 + 3
    assert curve["x"] == sorted(curve["x"])
    finite = [y for y in curve["y"] if y is not None]
    assert max(finite) == 50.0 and min(finite) == -50.0
    assert sorted(curve["marks"]) == [[3000, "NaN"], [4000, "inf"], [5000, "-inf"]]


def test_zooming_refines_to_every_point_of_the_range(root: Path) -> None:
    write(root)
    curve, = series(root, SeriesQuery(key="x", runs=(("p", "big"),), buckets=100,
                                      lo=7_700, hi=7_850))["curves"]
    assert curve["x"] == list(range(7_700, 7_851)) and 50.0 in curve["y"]


def test_ranks_each_their_own_or_their_mean_with_a_band(root: Path) -> None:
    write(root)
    q = SeriesQuery(key="x", runs=(("p", "big"),), buckets=10_000, lo=0, hi=9)
    every = series(root, replace(q, ranks="all"))["curves"]
    assert [c["series"] for c in every] == [0, 1]
    mean, = series(root, replace(q, ranks="mean"))["curves"]
    pairs = zip(every[0]["y"], every[1]["y"], strict=True)
    assert mean["y"] == [pytest.approx((a + b) / 2) for a, b in pairs]
    assert mean["lo"] == every[0]["y"] and mean["hi"] == every[1]["y"]
    first, = series(root, q)["curves"]
    assert first["y"] == every[0]["y"]


def test_x_is_the_step_the_wall_time_or_the_time_since_the_run_started(root: Path) -> None:
    with tracklake.init(project="p", run_id="t", root=root) as run:
        for step in range(5):
            run.log({"y": step}, step=step)
    q = SeriesQuery(key="y", runs=(("p", "t"),))
    wall, = series(root, replace(q, x="time"))["curves"]
    relative, = series(root, replace(q, x="relative"))["curves"]
    assert wall["x"][0] > 1.6e9 and 0 <= relative["x"][0] < 60
    assert relative["x"] == sorted(relative["x"])
    assert series(root, SeriesQuery(key="y", runs=(("p", "nope"),)))["curves"] == []


def test_a_group_is_the_mean_of_its_runs_with_their_range(root: Path) -> None:
    for name, lr, offset in (("a", 0.1, 0.0), ("b", 0.1, 2.0), ("c", 0.3, 10.0)):
        with tracklake.init(project="p", run_id=name, root=root, config={"lr": lr}) as run:
            for step in range(3):
                run.log({"y": step + offset}, step=step)
    runs = (("p", "a"), ("p", "b"), ("p", "c"))
    curves = series(root, SeriesQuery(key="y", runs=runs, group="lr"))["curves"]
    assert [(c["run"], c["y"], c["lo"], c["hi"]) for c in curves] == [
        ("0.1", [1.0, 2.0, 3.0], [0.0, 1.0, 2.0], [2.0, 3.0, 4.0]),
        ("0.3", [10.0, 11.0, 12.0], [10.0, 11.0, 12.0], [10.0, 11.0, 12.0])]


def test_a_zero_is_sent_as_zero_never_as_minus_zero(root: Path) -> None:
    """A band's edge or a mean of zero is +0.0 whatever sign its values had: DuckDB's
    min of -0.0 and 0.0 is either, in an order of its threads' choosing, so the same
    chart's answer differed from one request to the next."""
    for name in ("a", "b"):
        with tracklake.init(project="p", run_id=name, root=root, config={"lr": 0.1}) as run:
            for step in range(3):
                run.log({"y": -0.0 if step else 0.0}, step=step)
    runs = (("p", "a"), ("p", "b"))
    for group in (None, "lr"):
        for curve in series(root, SeriesQuery(key="y", runs=runs, group=group))["curves"]:
            edges = curve["y"] + curve.get("lo", []) + curve.get("hi", [])
            assert len(edges) == (9 if group else 3) and edges == [0.0] * len(edges)
            assert [math.copysign(1, v) for v in edges] == [1.0] * len(edges), (group, edges)


def test_a_resumed_attempt_is_marked_where_it_took_over(root: Path) -> None:
    with tracklake.init(project="p", run_id="r", root=root) as run:
        for step in range(10):
            run.log({"y": 1.0}, step=step)
    with tracklake.init(project="p", run_id="r", root=root) as run:  # resumed from step 6
        for step in range(6, 12):
            run.log({"y": 2.0}, step=step)
    answer = series(root, SeriesQuery(key="y", runs=(("p", "r"),)))
    assert [(a["attempt"], a["step"], a["x"]) for a in answer["attempts"]] == [(2, 6, 6.0)]
    assert answer["curves"][0]["y"] == [1.0] * 6 + [2.0] * 6


def test_a_buckets_tied_extremes_are_drawn_at_their_first_x(root: Path) -> None:
    """Asked twice, a chart is the same: of tied smallest (largest) values in a bucket,
    the first one's x is kept."""
    with tracklake.init(project="p", run_id="ties", root=root) as run:
        for step in range(100):
            run.log({"y": step % 2}, step=step)
    curve, = series(root, SeriesQuery(key="y", runs=(("p", "ties"),), buckets=10))["curves"]
    assert curve["x"] == [x for b in range(0, 100, 10) for x in (b, b + 1)]
    assert curve["y"] == [0.0, 1.0] * 10


@pytest.mark.parametrize("grouped", [False, True])
def test_a_mean_is_the_same_each_time_it_is_asked(root: Path, grouped: bool) -> None:
    """A mean over ranks or over a group's runs is summed in an order of DuckDB's threads'
    choosing: with a plain float sum a last-bit difference moved tied extremes to another
    x from one answer to the next. The compensated sum gives one answer."""
    rng = np.random.default_rng(3)
    for name in ("a", "b"):
        for rank in (0, 1, 2):
            values = np.round(rng.normal(size=3000), 1) / 3  # thirds: last bits matter
            with tracklake.init(project="p", run_id=name, root=root, rank=rank,
                                config={"lr": 0.1}, capture_identity=False,
                                system_metrics=False) as run:
                for step in range(3000):
                    run.log({"y": float(values[step])}, step=step)
    q = SeriesQuery(key="y", runs=(("p", "a"), ("p", "b")), ranks="mean", buckets=100,
                    group="lr" if grouped else None)
    answers = {repr(series(root, q)["curves"]) for _ in range(6)}
    assert len(answers) == 1


def test_steps_past_what_a_double_holds_are_drawn_not_refused(root: Path) -> None:
    """Steps up to 2**63 - 1 (a global token count, a nanosecond clock): x is a double,
    so a step past 2**53 is sent as the nearest one (a float, never an int it is not),
    in order; the answer is still JSON the page reads, and with many such points the
    extremes survive downsampling."""
    import json

    from tracklake._ui.json_bytes import json_bytes

    steps = [0, 1, 2**53 - 1, 2**53, 2**53 + 1, 2**62, 2**63 - 1]
    with tracklake.init(project="p", run_id="huge", root=root) as run:
        for i, step in enumerate(steps):
            run.log({"tokens": float(i)}, step=step)
        for i in range(3_000):  # many more: the curve is downsampled to 10 buckets
            run.log({"dense": -1.0 if i == 1_234 else float(i % 7)}, step=2**62 + i * 2**40)
    curve, = series(root, SeriesQuery(key="tokens", runs=(("p", "huge"),)))["curves"]
    assert curve["points"] == len(steps) and curve["y"] == [float(i) for i in range(7)]
    assert curve["x"][:3] == [0, 1, 2**53 - 1]
    assert all(isinstance(x, int) for x in curve["x"][:3])
    assert [type(x) for x in curve["x"][3:]] == [float] * 4
    assert curve["x"][3:] == [float(s) for s in steps[3:]] == sorted(curve["x"][3:])
    sent = json.loads(json_bytes(curve))
    assert sent["x"] == curve["x"] and sent["y"] == curve["y"]
    dense, = series(root, SeriesQuery(key="dense", runs=(("p", "huge"),),
                                      buckets=10))["curves"]
    assert dense["points"] == 3_000 and len(dense["x"]) <= 2 * 10 + 3
    assert min(y for y in dense["y"] if y is not None) == -1.0
    assert dense["x"][dense["y"].index(-1.0)] == float(2**62 + 1_234 * 2**40)

