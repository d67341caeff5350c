"""What `Run.log` and `log_config` accept, how values are flattened and coerced, and that
special floats survive the trip to disk exactly."""

from __future__ import annotations

import json
import math
import re
import struct
import tempfile
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from _optional import optional
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracklake
from tracklake._write.coerce import coerce_metrics, flatten, flatten_config, to_float

FAST = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
SLOW = settings(max_examples=8, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

# Keys without '/' so that a flattened key can be split back unambiguously.
segment_keys = st.text(
    alphabet=st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)),
    min_size=1, max_size=8)
any_float = st.floats(allow_nan=True, allow_infinity=True)


def _bits(x: float) -> bytes:
    """Exact identity of a float (NaN payload and the sign of zero included)."""
    return struct.pack("<d", x)


def _same_float(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return _bits(a) == _bits(b)


def _init(root: Path, **kw: Any) -> tracklake.Run:
    kw.setdefault("capture_identity", False)
    kw.setdefault("flush_interval", 60.0)  # the test decides when data is written
    return tracklake.init(project="coerce", root=root, **kw)


def _segment_rows(root: Path, kind: str) -> list[dict[str, Any]]:
    """Every row of `kind` read with plain pyarrow from the raw segment files."""
    rows: list[dict[str, Any]] = []
    for path in sorted(root.glob(f"{kind}/**/*seg-*.arrows")):
        with pa.ipc.open_stream(path.read_bytes()) as reader:
            rows.extend(reader.read_all().to_pylist())
    return rows


# -- flattening -------------------------------------------------------------------------

def _nested(depth: int = 3) -> st.SearchStrategy[Any]:
    return st.recursive(any_float, lambda children: st.dictionaries(segment_keys, children,
                                                                    max_size=4),
                        max_leaves=12)


def _expected_flat(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _expected_flat(value, prefix + key + "/")
        else:
            yield prefix + key, value


@FAST
@given(tree=st.dictionaries(segment_keys, _nested(), max_size=5))
def test_flatten_joins_nested_keys_with_slash_and_keeps_every_leaf(tree: dict[str, Any]) -> None:
    """flatten() yields one (a/b/c, leaf) pair per leaf, in mapping order, leaves untouched."""
    got = list(flatten(tree))
    expected = list(_expected_flat(tree))
    assert [k for k, _ in got] == [k for k, _ in expected]
    assert all(_same_float(a, b) for (_, a), (_, b) in zip(got, expected, strict=True))


@FAST
@given(tree=st.dictionaries(segment_keys, _nested(), max_size=5))
def test_coerce_metrics_returns_flat_float_values_for_nested_numbers(
        tree: dict[str, Any]) -> None:
    """coerce_metrics flattens and returns float values, NaN and infinities kept exactly."""
    keys, values, texts = coerce_metrics(tree)
    expected = list(_expected_flat(tree))
    assert texts == {}
    assert keys == [k for k, _ in expected]
    assert all(type(v) is float for v in values)
    assert all(_same_float(a, b) for a, (_, b) in zip(values, expected, strict=True))


def test_empty_nested_mapping_contributes_no_keys() -> None:
    """An empty sub-mapping yields nothing rather than a key with a mapping value."""
    assert list(flatten({"a": {}, "b": {"c": 1}})) == [("b/c", 1)]


# -- accepted scalar types --------------------------------------------------------------

@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, 1.0), (False, 0.0), (0, 0.0), (-7, -7.0), (2**53 + 1, float(2**53 + 1)),
        (1.5, 1.5), (Fraction(1, 4), 0.25),
        (np.bool_(True), 1.0), (np.bool_(False), 0.0),
        (np.int8(-3), -3.0), (np.uint64(2**64 - 1), float(2**64 - 1)), (np.int64(42), 42.0),
        (np.float16(0.5), 0.5), (np.float32(0.25), 0.25), (np.float64(-2.5), -2.5),
        (np.array(3.5), 3.5), (np.array(7, dtype=np.int32), 7.0), (np.array(True), 1.0),
        (np.array([2], dtype=np.int8), 2.0), (np.array([[0.125]]), 0.125),
        (np.array([True]), 1.0), (np.array([9], dtype=np.uint16), 9.0),
    ],
    ids=repr,
)
def test_real_scalars_become_floats(value: object, expected: float) -> None:
    """bool, int, float, Fraction, numpy scalars, 0-d arrays and size-1 arrays are accepted."""
    got = to_float("k", value)
    assert type(got) is float
    assert got == expected


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float32("nan"),
                                   np.float16("inf"), np.float64("-inf"), np.array(np.nan)],
                         ids=repr)
def test_non_finite_values_are_kept_not_refused(value: object) -> None:
    """NaN and ±inf are legitimate metric values (a diverging loss): kept as they are."""
    got = to_float("k", value)
    assert isinstance(got, float)
    assert _same_float(got, float(value))  # type: ignore[arg-type]


def test_strings_are_returned_as_text() -> None:
    """A str value (and a 0-d numpy str array) is text, not a metric."""
    assert to_float("k", "hello") == "hello"
    assert to_float("k", np.array("abc")) == "abc"
    assert coerce_metrics({"loss": 1, "note": "warmup", "x": {"msg": "hi"}}) == (
        ["loss"], [1.0], {"note": "warmup", "x/msg": "hi"})


# -- refused values: TypeError naming the key ------------------------------------------

class _DictLike:
    """Has items() and __getitem__ but is not a Mapping."""

    def __init__(self) -> None:
        self._d = {"a": 1.0}

    def items(self) -> Any:
        return self._d.items()

    def keys(self) -> Any:
        return self._d.keys()

    def __getitem__(self, key: str) -> float:
        return self._d[key]


@pytest.mark.parametrize(
    "value",
    [None, [1.0], (1.0,), [], {1.0}, _DictLike(), 1 + 2j, np.complex128(1), np.array(1 + 2j),
     np.array([1 + 2j]), np.zeros(3), np.ones((2, 2)), np.array([None], dtype=object),
     b"bytes", object()],
    ids=lambda v: type(v).__name__ + (str(getattr(v, "shape", "")) or ""),
)
def test_unsupported_values_raise_type_error_naming_the_key(value: object) -> None:
    """None, sequences, dict-like non-mappings, complex and non-scalar arrays are refused
    with a TypeError that names the (flattened) key."""
    with pytest.raises(TypeError, match=re.escape("'outer/bad_key'")):
        coerce_metrics({"fine": 1.0, "outer": {"bad_key": value}})


def test_large_numpy_array_message_names_key_and_shape() -> None:
    """The message for an array says which key and which shape, and suggests a summary."""
    with pytest.raises(TypeError, match=r"'acts'.*\(1000, 3\).*mean") as info:
        to_float("acts", np.zeros((1000, 3)))
    assert "acts" in str(info.value)


@pytest.mark.parametrize("key", [1, 2.5, None, ("a",), b"bytes"], ids=repr)
def test_non_str_keys_raise_type_error(key: object) -> None:
    """Keys must be str, at the top level and nested."""
    with pytest.raises(TypeError, match="keys must be str"):
        coerce_metrics({key: 1.0})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="keys must be str"):
        coerce_metrics({"outer": {key: 1.0}})  # type: ignore[dict-item]


@pytest.mark.parametrize("key", ["", "a\x00b"])
def test_empty_or_nul_keys_raise_value_error(key: str) -> None:
    with pytest.raises(ValueError, match="empty or contains NUL"):
        coerce_metrics({key: 1.0})


def test_run_log_refuses_bad_values_and_writes_nothing_of_the_call(root: Path) -> None:
    """Run.log raises TypeError naming the key (fast and slow path) and the refused call
    leaves no metric or text behind."""
    run = _init(root)
    with pytest.raises(TypeError, match="'opt/lr'"):
        run.log({"note": "text", "opt": {"lr": None}})
    with pytest.raises(TypeError, match="keys must be str"):
        run.log({1: 1.0})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="'hist'"):
        run.log({"hist": [1.0, 2.0]})
    run.log({"ok": 1.0}, step=0)
    run.finish()
    assert [(r["key"], r["value"]) for r in _segment_rows(root, "metrics")] == [("ok", 1.0)]
    assert _segment_rows(root, "texts") == []


# -- huge ints --------------------------------------------------------------------------

@pytest.mark.parametrize("sign", [1, -1])
def test_to_float_turns_huge_ints_into_signed_infinity(sign: int) -> None:
    """An int beyond float range becomes ±inf instead of crashing."""
    assert to_float("big", sign * 10**400) == sign * math.inf


def test_huge_int_on_log_slow_path_becomes_inf(root: Path) -> None:
    """A huge int next to a non-plain value (the coercing slow path) is stored as inf."""
    run = _init(root)
    run.log({"big": 10**400, "neg": -(10**400), "flag": True}, step=0)
    assert run.finish().complete
    values = {r["key"]: r["value"] for r in _segment_rows(root, "metrics")}
    assert values == {"big": math.inf, "neg": -math.inf, "flag": 1.0}


def test_huge_int_on_log_fast_path_becomes_inf(root: Path) -> None:
    """Huge ints among plain ints/floats (the fast path, converted on flush) are stored as
    ±inf, the flush does not fail and nothing is lost."""
    run = _init(root)
    run.log({"big": 10**400, "small": -(10**400), "x": 1.0}, step=0)
    report = run.finish()
    assert report.complete
    values = {r["key"]: r["value"] for r in _segment_rows(root, "metrics")}
    assert values == {"big": math.inf, "small": -math.inf, "x": 1.0}


def test_ints_beyond_float_precision_on_fast_path_are_written_as_nearest_float(
        root: Path) -> None:
    """Ints that pyarrow refuses to convert exactly (2**53+1, 2**70) are stored as floats."""
    run = _init(root)
    run.log({"a": 2**53 + 1, "b": 2**70, "c": 0.5}, step=0)
    assert run.finish().complete
    values = {r["key"]: r["value"] for r in _segment_rows(root, "metrics")}
    assert values == {"a": float(2**53 + 1), "b": float(2**70), "c": 0.5}


# -- end to end through the store -------------------------------------------------------

@SLOW
@given(values=st.dictionaries(segment_keys, any_float, min_size=1, max_size=6))
def test_logged_floats_read_back_bit_exact_from_segments(values: dict[str, float]) -> None:
    """Whatever float is logged (NaN, ±inf, -0.0, subnormals) is what plain pyarrow reads
    back from the segment files."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run = _init(root)
        run.log(values, step=5)
        assert run.finish().complete
        rows = _segment_rows(root, "metrics")
    assert [r["key"] for r in rows] == list(values)
    assert all(r["step"] == 5 for r in rows)
    assert all(_same_float(r["value"], values[r["key"]]) for r in rows)


def test_nan_and_infinities_survive_segments_compaction_and_query(root: Path) -> None:
    """NaN, +inf and -inf are stored exactly: in the segments, then after compaction into
    Parquet, through tracklake.query."""
    run = _init(root)
    run.log({"nan": math.nan, "pinf": math.inf, "ninf": -math.inf, "np_nan": np.float32("nan"),
             "arr_inf": np.array([np.inf])}, step=1)
    assert run.finish().complete

    raw = {r["key"]: r["value"] for r in _segment_rows(root, "metrics")}
    assert math.isnan(raw["nan"]) and math.isnan(raw["np_nan"])
    assert raw["pinf"] == math.inf and raw["arr_inf"] == math.inf and raw["ninf"] == -math.inf

    report = tracklake.compact(root=root)
    assert report.parts_written and not list(root.glob("metrics/**/*seg-*.arrows"))
    table = tracklake.query("select key, value from metrics order by key", root=root)
    got = dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist(),
                   strict=True))
    assert set(got) == {"nan", "pinf", "ninf", "np_nan", "arr_inf"}
    assert math.isnan(got["nan"]) and math.isnan(got["np_nan"])
    assert got["pinf"] == math.inf and got["arr_inf"] == math.inf and got["ninf"] == -math.inf


def test_strings_in_log_become_text_records_not_metrics(root: Path) -> None:
    """run.log({'loss': 1.0, 'sample': 'text'}) writes loss as a metric and sample as a
    `texts` record at the same step."""
    run = _init(root)
    run.log({"loss": 0.5, "sample": "the cat sat", "eval": {"note": "ok", "acc": 1}}, step=7)
    run.finish()
    metrics = _segment_rows(root, "metrics")
    texts = _segment_rows(root, "texts")
    assert sorted((r["key"], r["value"], r["step"]) for r in metrics) == [
        ("eval/acc", 1.0, 7), ("loss", 0.5, 7)]
    assert sorted((r["key"], r["text"], r["step"]) for r in texts) == [
        ("eval/note", "ok", 7), ("sample", "the cat sat", 7)]


def test_nested_mappings_are_stored_under_slash_keys(root: Path) -> None:
    run = _init(root)
    run.log({"train": {"loss": 1.0, "opt": {"lr": 3e-4}}, "step_time": np.float32(0.25)}, step=0)
    run.finish()
    got = {r["key"]: r["value"] for r in _segment_rows(root, "metrics")}
    assert got == {"train/loss": 1.0, "train/opt/lr": 3e-4, "step_time": 0.25}


# -- torch ------------------------------------------------------------------------------

def test_torch_scalar_tensors_are_accepted(root: Path) -> None:
    """0-d CPU tensors of several dtypes (bfloat16 and bool included) and a 1-element
    tensor are logged as floats; a 2x2 tensor is refused with a TypeError naming the key."""
    torch = optional("torch")  # make test installs the CPU build on the default Python
    cases = {
        "f32": (torch.tensor(1.5, dtype=torch.float32), 1.5),
        "f64": (torch.tensor(-2.25, dtype=torch.float64), -2.25),
        "f16": (torch.tensor(0.5, dtype=torch.float16), 0.5),
        "bf16": (torch.tensor(2.0, dtype=torch.bfloat16), 2.0),
        "i64": (torch.tensor(7, dtype=torch.int64), 7.0),
        "i8": (torch.tensor(-3, dtype=torch.int8), -3.0),
        "bool": (torch.tensor(True), 1.0),
        "one_element": (torch.tensor([4.0]), 4.0),
        "nan": (torch.tensor(float("nan")), math.nan),
    }
    for key, (tensor, expected) in cases.items():
        got = to_float(key, tensor)
        assert isinstance(got, float), key
        assert _same_float(got, expected), key
    with pytest.raises(TypeError, match="'grads/w'"):
        coerce_metrics({"grads": {"w": torch.ones(2, 2)}})
    with pytest.raises(TypeError, match="'c'"):
        to_float("c", torch.tensor(1 + 2j))

    run = _init(root)
    run.log({k: t for k, (t, _) in cases.items()}, step=0)
    run.finish()
    got = {r["key"]: r["value"] for r in _segment_rows(root, "metrics")}
    assert set(got) == set(cases)
    assert all(_same_float(got[k], e) for k, (_, e) in cases.items())


# -- configs ----------------------------------------------------------------------------

def test_config_dict_is_flattened_and_json_encoded(root: Path) -> None:
    """log_config stores one record per flattened key with the leaf JSON-encoded; lists are
    kept as lists and numpy values become plain JSON."""
    run = _init(root, config={"model": {"layers": 2, "dims": [64, 64]},
                              "lr": np.float32(0.5), "name": "x"})
    run.finish()
    got = {r["key"]: json.loads(r["value"]) for r in _segment_rows(root, "configs")}
    assert got == {"model/layers": 2, "model/dims": [64, 64], "lr": 0.5, "name": "x"}


def test_omegaconf_config_is_flattened_and_resolved(root: Path) -> None:
    """An OmegaConf DictConfig (with interpolations) is resolved and flattened with '/'."""
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({
        "model": {"hidden": 128, "ffn": "${model.hidden}", "act": "gelu"},
        "optim": {"lr": 1e-4, "betas": [0.9, 0.95]},
        "run_name": "exp-${model.act}",
    })
    assert flatten_config(cfg) == {"model/hidden": 128, "model/ffn": 128, "model/act": "gelu",
                                   "optim/lr": 1e-4, "optim/betas": [0.9, 0.95],
                                   "run_name": "exp-gelu"}
    run = _init(root, config=cfg)
    run.finish()
    stored = {r["key"]: json.loads(r["value"]) for r in _segment_rows(root, "configs")}
    assert stored["model/ffn"] == 128
    assert stored["run_name"] == "exp-gelu"
    assert stored["optim/betas"] == [0.9, 0.95]
    attempt = json.loads(next(root.glob("runs/**/attempt=1.json")).read_bytes())
    assert attempt["config"]["model/ffn"] == 128
    assert "${" not in json.dumps(attempt["config"])


def test_unsupported_config_type_raises_type_error(root: Path) -> None:
    with pytest.raises(TypeError, match="config of type"):
        _init(root, config=[1, 2, 3])
    assert not list(root.glob("runs/**/*.json"))
