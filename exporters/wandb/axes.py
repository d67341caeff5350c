"""Keys on an x-axis of their own (``define_metric(name, step_metric=...)``, recorded by
`tracklake.wandb`) in a W&B run written in several sessions.

The store holds such a key at its step metric's value, not at W&B's step: an eval
accuracy at ``eval/step`` 3 sits at store step 3 beside a training loss of W&B step 3.
W&B charts the key against its step metric whatever the row's step (``_step``), but takes
rows only at increasing steps: logged at their axis values, the keys of a later session
would come below the steps the earlier sessions reached and be dropped, and an axis whose
values run ahead (seconds, tokens) would push W&B's step past the steps still to come.

So each *axis row* (the keys of one axis at one axis value) gets a W&B step of its own
(`place`): the step of the latest row of W&B's own axis written before it (record time),
but above the run's last W&B step and above the previous row of the same axis; the axis
value joins the row (W&B's ``step_sync``). While the run is live, an axis row that would
go above the highest step of W&B's own axis waits for a later session (in the state), so
that the steps of the own axis still to come stay free; the last session of an ended run
places everything. A run of axis rows only numbers them from its last step on.

With ``--ranks all`` a key ``rank{r}/<key>`` is on ``rank{r}/<its step metric>``, and the
W&B run gets each rule once per rank (`sent_rules`).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tracklake.read import MetricAxes, MetricRule

if TYPE_CHECKING:
    from tracklake.exporters.wandb.rows import Value

#: A rule's options the exporter reads and sends (wandb 0.31 has no ``goal`` any more),
#: with the JSON types each may take.
OPTIONS: dict[str, tuple[type, ...]] = {
    "step_metric": (str,), "step_sync": (bool,), "hidden": (bool,), "summary": (str,)}
#: Most distinct rule names a run keeps (a crafted store could record millions).
MAX_RULES = 10_000
_RANK = re.compile(r"rank\d+/")
#: The JSON form of a table in an axis row (its columns and rows), made a `wandb.Table`
#: when its row is logged.
TABLE_TYPE_TAG = "tracklake-table"


def valid_rule(rule: Any) -> dict[str, Any] | None:
    """A `define_metric` rule as the state and W&B take it (``name`` and known options of
    their JSON types), None for anything else."""
    if not isinstance(rule, Mapping) or not isinstance(rule.get("name"), str):
        return None
    name = rule["name"]
    if not name or "*" in name[:-1]:
        return None
    out: dict[str, Any] = {"name": name}
    for option, types in OPTIONS.items():
        value = rule.get(option)
        if value is not None:
            if not isinstance(value, types) or (isinstance(value, str) and not value):
                return None
            out[option] = value
    return out


def merge_rules(known: list[dict[str, Any]], new: Iterable[dict[str, Any]]) -> bool:
    """Add `new` rules to `known` in place (a name given again updates its options, as
    W&B merges them); False if `known` reached `MAX_RULES` and some were left out."""
    index = {rule["name"]: rule for rule in known}
    complete = True
    for rule in new:
        if rule["name"] in index:
            index[rule["name"]].update(rule)
        elif len(index) < MAX_RULES:
            index[rule["name"]] = dict(rule)
            known.append(index[rule["name"]])
        else:
            complete = False
    return complete


def sent_rules(rules: list[dict[str, Any]], ranks: Iterable[int] | None
               ) -> list[dict[str, Any]]:
    """The `define_metric` calls of a session: each rule, or with `ranks` (``--ranks
    all``) each rule once per rank under its ``rank{r}/`` prefix."""
    if ranks is None:
        return [dict(rule) for rule in rules]
    out = []
    for rank in ranks:
        prefix = f"rank{rank}/"
        for rule in rules:
            named = {**rule, "name": prefix + rule["name"]}
            if "step_metric" in rule:
                named["step_metric"] = prefix + rule["step_metric"]
            out.append(named)
    return out


@dataclass
class AxisRow:
    """The keys of one axis at one of its values, and when the first was written (µs;
    None if no record said)."""

    time: int | None
    values: dict[str, Value]

    def add(self, key: str, value: Value, time: int | None) -> None:
        self.values[key] = value
        if time is not None:
            self.time = time if self.time is None else min(self.time, time)

    def order(self) -> int:
        return -1 if self.time is None else self.time


class AxisRules:
    """Which axis each key is on, by the run's rules (`tracklake.wandb`'s own matching)."""

    def __init__(self, rules: list[dict[str, Any]], *, prefixed: bool) -> None:
        self._axes = MetricAxes()
        for rule in rules:
            self._axes.define(MetricRule(**rule))
        self._prefixed = prefixed

    def __bool__(self) -> bool:
        return bool(self._axes.step_metrics)

    def axis_of(self, key: str) -> tuple[str, bool] | None:
        """(the step metric `key` is charted against, whether W&B syncs it into the
        key's rows) for a key on an axis of its own (a step metric is on itself)."""
        prefix, name = "", key
        if self._prefixed:
            found = _RANK.match(key)
            if found:
                prefix, name = found.group(), key[found.end():]
        if name in self._axes.step_metrics:
            return key, True
        rule = self._axes.rule_for(name)
        if rule is None or not rule.step_metric:
            return None
        return prefix + rule.step_metric, rule.step_sync is not False

    def axis_at(self, key: str, step: int, values: Mapping[str, Any],
                rows: Mapping[tuple[str, int], AxisRow]) -> str | None:
        """The axis of `key`'s value at store `step`, among the other `values` at that
        step and the axis `rows` found so far; None if it is on W&B's own axis there (a
        key that W&B does not sync with its axis is at W&B's step where its row had no
        axis value)."""
        found = self.axis_of(key)
        if found is None:
            return None
        axis, synced = found
        return axis if synced or axis in values or (axis, step) in rows else None


def place(axis_rows: Mapping[tuple[str, int], AxisRow], own: Mapping[int, int | None],
          last_step: int | None, top: int | None, final: bool
          ) -> tuple[dict[int, dict[str, Value]], dict[tuple[str, int], AxisRow]]:
    """({W&B step: values} of the axis rows placed now, the rows that wait), as the module
    docs say. `own` maps each step of W&B's own axis logged in this session to its
    earliest record time; `top` is the highest step of the own axis the W&B run has or
    gets now (None: it has none); `final`: the run's last session."""
    floor = 0 if last_step is None else last_step + 1
    anchors = sorted((-1 if time is None else time, step) for step, time in own.items())
    times = [time for time, _ in anchors]
    highest: list[int] = []
    for _, step in anchors:
        highest.append(max(step, highest[-1]) if highest else step)
    placed: dict[int, dict[str, Value]] = {}
    waiting: dict[tuple[str, int], AxisRow] = {}
    previous: dict[str, int] = {}
    stalled: set[str] = set()  # axes with a waiting row: their later rows wait behind it
    for (axis, value), row in sorted(axis_rows.items(),
                                     key=lambda item: (item[1].order(), item[0][1], item[0][0])):
        before = bisect.bisect_right(times, row.order())
        step = max(floor, highest[before - 1] if before else floor)
        if axis in previous:
            step = max(step, previous[axis] + 1)
        if axis in stalled or (not final and top is not None and step > top):
            waiting[(axis, value)] = row
            stalled.add(axis)
            continue
        previous[axis] = step
        placed.setdefault(step, {}).update(row.values)
    return placed, waiting

