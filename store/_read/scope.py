"""What a question touches: the record kinds, the attempt files and the runs a connection
has to read, so that answering it costs what it reads and not what the store holds."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from tracklake._format import KINDS
from tracklake._read.one_run import narrowed_to, table_names
from tracklake._read.readonly import parsing, statements_of

#: Views over the attempt files only.
_ATTEMPT_VIEWS = frozenset({"runs", "run_attempts"})
#: Views over the metric summaries (part footers and the live metrics).
_SUMMARY_VIEWS = frozenset({"metric_summaries", "metric_summaries_all"})


@dataclass(frozen=True)
class Scope:
    """The part of the store a connection reads: `kinds` (their parts and live tails),
    the attempt files if `attempts`, and only run `run` of `project` if given. Views
    outside the scope are not created, so a question that needs one fails loudly (and is
    asked again with everything) instead of getting an empty answer.

    Without `metric_values`, a question about the metric summaries alone, the metric
    parts' dataset holds only those of resumed runs (whose summaries are computed from
    their visible values): the `metrics` views are there for `metric_summaries` and are
    not whole. Without `summaries`, a question that names no summary view, those views
    are not made (unless a resumed run's cutoffs need them). With `runs`, only those
    (project, run) are read (the runs a listing shows, `run_index`). Without
    `attempt_rows`, a question that names the runs view and not `run_attempts`, the
    runs view may hold its rows alone (`runs_rows`). With `shard` (and `runs`, those
    of the store whose names hash to it), the runs of that catalog file alone, whose
    file is brought up to date (`_ops/catalog_pass.py`)."""

    kinds: frozenset[str] = frozenset(KINDS)
    attempts: bool = True
    project: str | None = None
    run: str | None = None
    metric_values: bool = True
    summaries: bool = True
    runs: frozenset[tuple[str, str]] | None = None
    attempt_rows: bool = True
    shard: int | None = None

    @property
    def everything(self) -> bool:
        return self.kinds == frozenset(KINDS) and self.attempts and self.project is None \
            and self.run is None and self.runs is None

    def for_run(self, project: str | None, run: str | None) -> Scope:
        return Scope(self.kinds, self.attempts, project, run, self.metric_values,
                     self.summaries, attempt_rows=self.attempt_rows)

    def for_runs(self, runs: frozenset[tuple[str, str]]) -> Scope:
        return Scope(self.kinds, self.attempts, metric_values=self.metric_values,
                     summaries=self.summaries, runs=runs, attempt_rows=self.attempt_rows)


EVERYTHING = Scope()


def scope_of_views(names: set[str]) -> Scope:
    """The scope that holds the views named (lower case)."""
    kinds = {k for k in KINDS if k in names or f"{k}_all" in names}
    if "run_configs" in names:
        kinds.add("configs")
    if names & _SUMMARY_VIEWS:
        kinds.add("metrics")
    return Scope(frozenset(kinds), bool(names & _ATTEMPT_VIEWS),
                 metric_values=bool(names & {"metrics", "metrics_all"}),
                 summaries=bool(names & _SUMMARY_VIEWS),
                 attempt_rows="run_attempts" in names)


def view_names() -> set[str]:
    """Every view a tracklake connection has (lower case)."""
    return {*KINDS, *(f"{k}_all" for k in KINDS), "run_configs", *_SUMMARY_VIEWS,
            *_ATTEMPT_VIEWS}


def scope_of_sql(sql: str, params: Any = None) -> Scope:
    """The views `sql` names, by DuckDB's own parser, and the one run (or project) it is
    restricted to, if any (`one_run`, with the named `params` it is given); everything
    when it cannot tell. Kept for the last questions asked (parsing one takes 0.7 ms, a
    tenth of a question about one run), when their parameters are plain values."""
    # with each value's type: 1, 1.0 and True are equal keys, and narrow to other runs
    if params is None:
        given: tuple[Any, ...] | None = None
    elif isinstance(params, dict):
        given = ("named", *((k, type(v), v) for k, v in params.items()))
    else:
        given = ("listed", *((type(v), v) for v in params))
    try:
        return _kept_scope_of_sql(sql, given)
    except TypeError:  # a parameter that is not hashable (a list): not kept
        return _scope_of_sql(sql, params)


@functools.lru_cache(maxsize=256)
def _kept_scope_of_sql(sql: str, given: tuple[Any, ...] | None) -> Scope:
    if given is None:
        return _scope_of_sql(sql, None)
    if given[0] == "named":
        return _scope_of_sql(sql, {k: v for k, _, v in given[1:]})
    return _scope_of_sql(sql, [v for _, v in given[1:]])


def _scope_of_sql(sql: str, params: Any) -> Scope:
    import duckdb

    names: set[str] = set()
    try:
        with parsing() as parser:
            for _, text in statements_of(sql):
                names |= {n.lower() for n in parser.get_table_names(text)}
    except duckdb.Error:
        # a statement with parameters, which get_table_names refuses, or one that fails
        # to bind here (the real run reports it)
        found = table_names(sql) if params is not None else None
        if found is None:
            return EVERYTHING
        names = found
    scope = scope_of_views(names)
    if not scope.kinds and not scope.attempts:
        return EVERYTHING  # none of the views: it may be looking at the catalog itself
    narrowed = narrowed_to(sql, view_names(), params)
    if narrowed:
        scope = scope.for_run(narrowed.get("project"), narrowed.get("run"))
    return scope
