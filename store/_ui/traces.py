"""The dashboard's trace trees and events. Spans are read with the report's SQL and
built into trees with its code (`tracklake._report.sections`), then sent flat, each with
its depth and its parent's place, so that no nesting (a chain of spans as deep as the
limit) has to be encoded or decoded recursively."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracklake._read.query import query, with_connection
from tracklake._read.reader import ReadProblems
from tracklake._read.scope import scope_of_views
from tracklake._report.sections import MAX_SPANS, Span, traces_sql, trees
from tracklake._ui.series import run_ids
from tracklake._ui.shown import shown

Runs = tuple[tuple[str, str], ...]

#: Runs at most in one request for traces or events (the page asks for the first ticked).
MAX_RUNS = 20

#: A span's text fields (error, attributes, inputs, outputs) are sent up to this many
#: characters each; the span says which were clipped.
MAX_FIELD = 4000
_FIELDS = ("error", "attributes", "inputs", "outputs")


def traces(store: Path, runs: Runs, search: str, timeout: float,
           problems: ReadProblems | None = None) -> dict[str, Any]:
    """Per run, its spans (at most `MAX_SPANS`, the report's), of the traces holding
    `search` if it is not empty, in tree order: [{project, run, more, spans: [{..., depth,
    parent}]}], with the query each run's list came from."""
    def read(con: Any) -> dict[str, Any]:
        out, queries = [], []
        sql = traces_sql(bool(search))
        for project, run in runs:
            params = {"p": project, "r": run, **({"q": search} if search else {})}
            rows = query(sql, params=params, connection=con, timeout=timeout).to_pylist()
            out.append({"project": project, "run": run, "more": len(rows) > MAX_SPANS,
                        "spans": _flat(trees(rows[:MAX_SPANS]))})
            queries.append(shown(sql, params))
        return {"runs": out, "queries": queries}
    return with_connection(store, ReadProblems() if problems is None else problems, read,
                           scope_of_views({"traces"}))


def _flat(roots: list[Span]) -> list[dict[str, Any]]:
    """The trees in depth-first order, each span with `depth` and `parent` (the place of
    its parent in the list, None for a root)."""
    out: list[dict[str, Any]] = []
    todo: list[tuple[Span, int, int | None]] = [(s, 0, None) for s in reversed(roots)]
    while todo:
        span, depth, parent = todo.pop()
        row = {k: v for k, v in span.row.items() if k not in _FIELDS}
        clipped = [k for k in _FIELDS if isinstance(span.row[k], str)
                   and len(span.row[k]) > MAX_FIELD]
        row.update({k: span.row[k][:MAX_FIELD] if k in clipped else span.row[k]
                    for k in _FIELDS})
        out.append({**row, "clipped": clipped, "depth": depth, "parent": parent,
                    "children": len(span.children)})
        here = len(out) - 1
        todo.extend((c, depth + 1, here) for c in reversed(span.children))
    return out


#: The events view shows at most this many events (the latest), across the runs asked.
MAX_EVENTS = 2000
EVENTS_SQL = f"""SELECT project, run, time, step, rank, level, kind, title, text FROM events
WHERE list_contains($runs, project || chr(31) || run)
  AND ($level = '' OR level = $level) AND ($kind = '' OR kind = $kind)
ORDER BY time DESC, seq DESC LIMIT {MAX_EVENTS + 1}"""
_KINDS_SQL = """SELECT DISTINCT level, kind FROM events
WHERE list_contains($runs, project || chr(31) || run) ORDER BY ALL LIMIT 200"""


def events(store: Path, runs: Runs, level: str, kind: str, timeout: float,
           problems: ReadProblems | None = None) -> dict[str, Any]:
    """The runs' latest events (newest first) of `level` and `kind` (any if empty), the
    levels and kinds they have for the filters, and the query the rows came from."""
    params = {"runs": run_ids(runs), "level": level, "kind": kind}

    def read(con: Any) -> dict[str, Any]:
        rows = query(EVENTS_SQL, params=params, connection=con, timeout=timeout).to_pylist()
        kinds = query(_KINDS_SQL, params={"runs": params["runs"]}, connection=con,
                      timeout=timeout).to_pylist()
        for row in rows:
            row["time"] = row["time"].isoformat() if row["time"] is not None else None
            row["text"] = _clip(row["text"])
            row["title"] = _clip(row["title"])
        return {"events": rows[:MAX_EVENTS], "more": len(rows) > MAX_EVENTS,
                "levels": sorted({k["level"] for k in kinds if k["level"] is not None}),
                "kinds": sorted({k["kind"] for k in kinds if k["kind"] is not None}),
                "queries": [shown(EVENTS_SQL, params)]}
    return with_connection(store, ReadProblems() if problems is None else problems, read,
                           scope_of_views({"events"}))


def _clip(text: str | None) -> str | None:
    return text[:MAX_FIELD] if text is not None else None
