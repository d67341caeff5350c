"""W&B's history semantics: the step counter, the open row, and `define_metric` axes.

`History.log` follows ``wandb.log(data, step, commit)`` (wandb 0.31, checked against its
offline files): the row at the current step stays open and merges every call until it is
committed; ``log(d)`` commits it and advances the step; ``commit=False`` only merges;
``step=N`` above the current step commits the open row and opens row N (committed by the
next call without ``commit=False``); a step below the current one is ignored (W&B warns).

`Axes.split` turns one committed row into the store's steps: a key whose `define_metric`
rule names a ``step_metric`` is stored at that metric's value in the row (else at its last
value, as W&B's ``step_sync`` fills it in); a step metric at its own value; every other key
at W&B's step. A step metric whose value is not a whole number leaves its keys at W&B's step.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, fields, replace
from typing import Any

from tracklake._write.coerce import to_float

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
SUMMARY_OPS = frozenset({"min", "max", "mean", "last", "first", "copy", "none"})


@dataclass(frozen=True)
class MetricRule:
    """One `define_metric` call (a name, or a glob ending in ``*``)."""

    name: str
    step_metric: str | None = None
    step_sync: bool | None = None
    hidden: bool | None = None
    summary: str | None = None
    goal: str | None = None

    def options(self) -> dict[str, Any]:
        """The options that were given (for the record and for the W&B exporter)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "name" and getattr(self, f.name) is not None}


class Axes:
    """The `define_metric` rules of a run and the last value of each step metric."""

    def __init__(self) -> None:
        self.exact: dict[str, MetricRule] = {}
        self.globs: dict[str, MetricRule] = {}  # prefix (the name without its "*") -> rule
        self.last: dict[str, int] = {}  # step metric -> its last whole value
        self.not_whole: set[str] = set()  # step metrics already said to have other values
        self._rules: dict[str, MetricRule | None] = {}  # rule_for's answers, per key
        self._axes: set[str] = set()  # the step metrics

    def define(self, rule: MetricRule, *, overwrite: bool | None = None) -> MetricRule:
        """Add `rule`; without ``overwrite=True`` what it leaves unset keeps the earlier
        rule's value for the same name (W&B's merge)."""
        stripped = rule.name[:-1] if rule.name.endswith("*") else rule.name
        if "*" in stripped:
            raise ValueError(f"define_metric({rule.name!r}): only a trailing '*' glob is "
                             "supported (as in W&B)")
        table = self.globs if rule.name.endswith("*") else self.exact
        earlier = table.get(stripped)
        if earlier is not None and not overwrite:
            rule = replace(earlier, **rule.options())
        table[stripped] = rule
        self._rules.clear()
        self._axes = {r.step_metric for r in (*self.exact.values(), *self.globs.values())
                      if r.step_metric}
        return rule

    @property
    def step_metrics(self) -> set[str]:
        return self._axes

    def rule_for(self, key: str) -> MetricRule | None:
        """The exact rule of `key`, else the glob with the longest matching prefix."""
        try:
            return self._rules[key]
        except KeyError:
            rule = self._rules[key] = self._find_rule(key)
            return rule

    def _find_rule(self, key: str) -> MetricRule | None:
        rule = self.exact.get(key)
        if rule is not None and rule.step_metric:
            return rule
        matching = [p for p in self.globs if key.startswith(p)]
        if matching:
            return self.globs[max(matching, key=len)]
        return rule

    def split(self, row: dict[str, Any], wandb_step: int
              ) -> tuple[dict[int, dict[str, Any]], list[str]]:
        """({store step: {key: value}}, notes to say once) for one committed flat row."""
        if not self._axes:
            return {wandb_step: row}, []
        axes = self._axes
        notes: list[str] = []
        own: dict[str, int | None] = {}
        for axis in axes & row.keys():
            own[axis] = self._whole(axis, row[axis], notes)
            if own[axis] is not None:
                self.last[axis] = own[axis]  # type: ignore[assignment]
        out: dict[int, dict[str, Any]] = {}
        for key, value in row.items():
            step: int | None = None
            if key in own:
                step = own[key]
            else:
                rule = self.rule_for(key)
                if rule is not None and rule.step_metric and rule.step_metric != key:
                    axis = rule.step_metric
                    if axis in own:
                        step = own[axis]
                    elif rule.step_sync is not False:
                        step = self.last.get(axis)
            out.setdefault(wandb_step if step is None else step, {})[key] = value
        return out, notes

    def _whole(self, axis: str, value: Any, notes: list[str]) -> int | None:
        """`value` of step metric `axis` as a whole int64 step, else None (said once)."""
        try:
            number = to_float(axis, value)
        except TypeError:
            number = None
        if isinstance(number, float) and number.is_integer() and (
                _INT64_MIN <= number <= _INT64_MAX):
            return int(value) if type(value) is int else int(number)
        if axis not in self.not_whole:
            self.not_whole.add(axis)
            notes.append(f"step metric {axis!r} has value {value!r}, not a whole number: the "
                         "keys on its axis are stored at the W&B step there (a store step "
                         "is an int), here and wherever it happens again")
        return None


class History:
    """W&B's step counter and open row (the rules are in the module docstring)."""

    def __init__(self, start: int = 0) -> None:
        self.step = start
        self.row: dict[str, Any] = {}
        self.ignored = 0  # calls ignored for a step below the current one

    def log(self, data: dict[str, Any], step: Any = None, commit: bool | None = None
            ) -> list[tuple[int, dict[str, Any]]] | None:
        """The rows this call commits, as (W&B step, row); None if W&B ignores the call
        (`step` below the current step)."""
        committed: list[tuple[int, dict[str, Any]]] = []
        if step is not None:
            step = _step(step)
            if step < self.step:
                self.ignored += 1
                return None
            if step > self.step:
                if self.row:
                    committed.append((self.step, self.row))
                    self.row = {}
                self.step = step
        self.row.update(data)
        if (step is None and commit is None) or commit:
            committed.append((self.step, self.row))
            self.row = {}
            self.step += 1
        return committed

    def flush(self) -> list[tuple[int, dict[str, Any]]]:
        """The open row, committed at `finish()` as W&B commits it."""
        if not self.row:
            return []
        row, self.row = self.row, {}
        return [(self.step, row)]


def _step(step: Any) -> int:
    if isinstance(step, bool):
        raise TypeError(f"step must be an int, not bool {step!r}")
    try:
        value = operator.index(step)
    except TypeError:
        raise TypeError(f"step must be an int, not {type(step).__name__} {step!r}") from None
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"step {value} is outside the int64 range W&B and the store hold")
    return value
