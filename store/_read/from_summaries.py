"""A question over `metrics` that its runs' summaries answer, asked of `metric_summaries`.

"The last value of a key per run" or "its max per run" aggregates every value of that key
over every run; `metric_summaries` holds, per (project, run, rank, key), the count, min,
max, first and last step and the last value of the visible values (part footers and the
live tails; a resumed run's from its visible values), a row where `metrics` holds one per
step. A question of this shape, by DuckDB's own parse tree, is asked of the summaries:

- one SELECT of `metrics` alone (no join, CTE, subquery, window, sample or set operation);
- grouped by columns of `project`, `run`, `rank`, `key` only (or not grouped), filtered
  only by those columns: a filter on them keeps or drops a summary's values together;
- every other value is one of these aggregates of the rows, each the same over the
  summaries: ``max(value)``, ``min(value)``, ``max(step)``, ``min(step)``, ``count(*)``
  and ``arg_max(value, step)`` (the last value; a tie of steps picks one of them either
  way), alone or in ``+ - * /``, ``abs``, ``round``, a cast or a comparison; ORDER BY,
  HAVING, LIMIT and DISTINCT over them.

Each aggregate becomes the one over the summaries (``max(value)`` -> ``max("max")``, an
unnamed one keeps the name DuckDB gives it over `metrics`), so the answer has the same
columns, types and rows. Anything else, or a parse tree of a shape this code does not
know (another DuckDB version), is asked as written.

The summaries are read from the parts' footers, not their pages' values: a part whose
values alone are damaged (a page checksum fails, its footer and page headers are sound)
still counts in such an answer, as written (a question over its values leaves it out and
names it; `tracklake fsck` finds it).
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

from tracklake._read.one_run import holds_subquery, parse_tree
from tracklake._read.readonly import parsing

#: The columns a summary row shares with the values it summarises.
_SUMMARY_KEYS = frozenset({"project", "run", "rank", "key"})
#: (aggregate, its column) over `metrics` -> the same over `metric_summaries`.
_AGGREGATES = {
    ("max", ("value",)): "max(__summary_max)",
    ("min", ("value",)): "min(__summary_min)",
    ("max", ("step",)): "max(__summary_last_step)",
    ("min", ("step",)): "min(__summary_first_step)",
    ("count_star", ()): "CAST(coalesce(sum(__summary_count), 0) AS BIGINT)",
    ("arg_max", ("value", "step")): "arg_max(__summary_last_value, __summary_last_step)",
}
#: Aggregates by name: those above and others (which a question of the shape has none of).
_AGGREGATE_NAMES = frozenset({f for f, _ in _AGGREGATES} | {
    "sum", "avg", "count", "arg_min", "first", "last", "list", "any_value", "median",
    "quantile", "mode", "string_agg", "bool_and", "bool_or", "stddev", "variance"})
#: What a question asks instead of `metrics`: the summaries, under names no question of
#: the shape reads (an alias such as `max` stays the question's own).
_SUMMARIES = (
    "SELECT * FROM (SELECT project, run, rank, key, count AS __summary_count, "
    "min AS __summary_min, max AS __summary_max, first_step AS __summary_first_step, "
    "last_step AS __summary_last_step, last_value AS __summary_last_value "
    "FROM metric_summaries)")
#: Scalar functions and operators that may hold aggregates or summary columns: each
#: gives the same for the same arguments.
_SCALARS = frozenset({"+", "-", "*", "/", "abs", "round", "~~", "!~~", "~~*", "!~~*",
                      "prefix", "suffix", "contains", "starts_with", "lower", "upper"})
#: Expression classes that hold no column of their own (their children are checked).
_PLAIN = frozenset({"CONSTANT", "PARAMETER", "COMPARISON", "CONJUNCTION", "CAST",
                    "BETWEEN"})
_OPERATORS = frozenset({"COMPARE_IN", "COMPARE_NOT_IN", "OPERATOR_NOT",
                        "OPERATOR_IS_NULL", "OPERATOR_IS_NOT_NULL"})


class _Refused(Exception):
    """The question is not of the shape: it is asked as written."""


@functools.lru_cache(maxsize=256)
def summaries_sql(sql: str) -> str | None:
    """`sql` asked of `metric_summaries`, if it is of the module's shape; None
    otherwise. Kept for the last texts asked (parsing one takes about a millisecond)."""
    if "metrics" not in sql.lower():
        return None  # no parse for a question that cannot be of the shape
    tree = parse_tree(sql)
    statements = tree.get("statements") if tree else None
    if not isinstance(statements, list) or len(statements) != 1:
        return None
    try:
        node = _rewritten_within(statements[0].get("node"))
    except (_Refused, KeyError, TypeError, AttributeError, RecursionError):
        return None  # RecursionError: expressions nested near DuckDB's own depth limit
    out = dict(tree, statements=[dict(statements[0], node=node)])
    return _deserialized(out)


def _rewritten_within(node: Any) -> dict[str, Any]:
    """`_rewritten(node)`, or a SELECT of nothing but such a SELECT (as `first_rows_sql`
    wraps a statement) with the inner one rewritten: the outer one reads only its answer,
    which is the same."""
    table = node.get("from_table") if isinstance(node, dict) else None
    if isinstance(table, dict) and table.get("type") == "SUBQUERY" and \
            node.get("type") == "SELECT_NODE" and not node.get("cte_map", {}).get("map") \
            and not table.get("sample") and not holds_subquery(node):
        node = copy.deepcopy(node)
        inner = node["from_table"]["subquery"]
        inner["node"] = _rewritten_within(inner["node"])
        return dict(node)
    return _rewritten(node)


def _rewritten(node: Any) -> dict[str, Any]:
    """A copy of the SELECT `node` asked of the summaries; `_Refused` if it is not of the
    shape."""
    if not isinstance(node, dict) or node.get("type") != "SELECT_NODE" or \
            node.get("cte_map", {}).get("map") or node.get("sample") or \
            node.get("qualify") or node.get("aggregate_handling") != "STANDARD_HANDLING":
        raise _Refused
    table = node["from_table"]
    if table.get("type") != "BASE_TABLE" or table.get("schema_name") or \
            table.get("catalog_name") or table.get("column_name_alias") or \
            table.get("sample") or table.get("at_clause") or \
            str(table.get("table_name", "")).lower() != "metrics":
        raise _Refused
    node = copy.deepcopy(node)
    alias = str(table.get("alias") or "")
    tables = {"metrics", alias.lower()} - {""}
    node["from_table"] = _summaries_table(alias or "metrics")

    groups = node.get("group_expressions") or []
    keys = {_key_column(g, tables) for g in groups}
    if node.get("group_sets", []) != ([list(range(len(groups)))] if groups else []):
        raise _Refused  # ROLLUP, CUBE, GROUPING SETS
    if node.get("where_clause") is not None:
        _check_filter(node["where_clause"], tables, _SUMMARY_KEYS)
    aliases = {str(e.get("alias")).lower() for e in node["select_list"] if e.get("alias")}
    if aliases & {"value", "step", "seq", "time", "attempt"}:
        raise _Refused  # in HAVING, a column of `metrics` or the alias: not the same
    aggregates = 0
    items = []
    for item in node["select_list"]:
        new, found = _mapped(item, tables, keys, aliases=frozenset())
        if found and not new.get("alias"):
            new["alias"] = _name(item)
        aggregates += found
        items.append(new)
    node["select_list"] = items
    if not aggregates and not groups:
        raise _Refused  # rows, not aggregates: the values themselves
    if node.get("having") is not None:
        node["having"], _ = _mapped(node["having"], tables, keys, frozenset(aliases))
    for modifier in node.get("modifiers", []):
        kind = modifier.get("type")
        if kind == "ORDER_MODIFIER":
            for order in modifier["orders"]:
                if not _is_order_by_all(order["expression"]):
                    order["expression"], _ = _mapped(order["expression"], tables, keys,
                                                     frozenset(aliases))
        elif kind == "LIMIT_MODIFIER":
            for bound in (modifier.get("limit"), modifier.get("offset")):
                if bound is not None and bound.get("class") not in ("CONSTANT", "PARAMETER"):
                    raise _Refused
        elif kind != "DISTINCT_MODIFIER" or modifier.get("distinct_on_targets"):
            raise _Refused
    return dict(node)


def _is_order_by_all(expr: Any) -> bool:
    """True for ORDER BY ALL (the answer's own columns, in order)."""
    return isinstance(expr, dict) and expr.get("class") == "STAR" and \
        not expr.get("relation_name") and expr.get("expr") is None and not any(
            expr.get(f) for f in ("exclude_list", "replace_list", "rename_list",
                                  "qualified_exclude_list"))


def _column_name(ref: Any, tables: set[str]) -> str:
    """The column `ref` names, unqualified or qualified by one of `tables`; `_Refused`
    for anything else."""
    if not isinstance(ref, dict) or ref.get("class") != "COLUMN_REF":
        raise _Refused
    names = [str(n).lower() for n in ref["column_names"]]
    if len(names) == 2 and names[0] in tables:
        names = names[1:]
    if len(names) != 1:
        raise _Refused
    return names[0]


def _key_column(ref: Any, tables: set[str]) -> str:
    """The summary key column `ref` names (unqualified or qualified by the table)."""
    name = _column_name(ref, tables)
    if name not in _SUMMARY_KEYS:
        raise _Refused
    return name


def _check_filter(expr: Any, tables: set[str], columns: frozenset[str]) -> None:
    """`_Refused` unless `expr` reads only `columns` (through plain operators)."""
    if not isinstance(expr, dict):
        raise _Refused
    kind = expr.get("class")
    if kind == "COLUMN_REF":
        if _key_column(expr, tables) not in columns:
            raise _Refused
        return
    if kind == "FUNCTION":
        if expr.get("function_name") not in _SCALARS or _is_aggregate_call(expr):
            raise _Refused
        children = _arguments(expr)
    elif _is_plain(expr):
        children = _children(expr)
    else:
        raise _Refused
    for child in children:
        _check_filter(child, tables, columns)


def _mapped(expr: Any, tables: set[str], keys: set[str], aliases: frozenset[str]
            ) -> tuple[dict[str, Any], int]:
    """A copy of `expr` with each aggregate of `_AGGREGATES` over the summaries, and how
    many it holds; outside them, only the grouped `keys` and the select list's `aliases`
    (in ORDER BY and HAVING) may be read."""
    if not isinstance(expr, dict):
        raise _Refused
    kind = expr.get("class")
    if kind == "FUNCTION" and _is_aggregate_call(expr):
        if expr.get("distinct") or expr.get("filter") is not None or \
                (expr.get("order_bys") or {}).get("orders") or expr.get("export_state"):
            raise _Refused
        columns = tuple(_column_name(argument, tables) for argument in _arguments(expr))
        replacement = _AGGREGATES.get((str(expr["function_name"]).lower(), columns))
        if replacement is None:
            raise _Refused
        new = _expression(replacement)
        new["alias"] = expr.get("alias", "")
        return new, 1
    if kind == "COLUMN_REF":
        names = [str(n).lower() for n in expr["column_names"]]
        if len(names) == 1 and names[0] in aliases:
            return copy.deepcopy(expr), 0
        if _key_column(expr, tables) not in keys:
            raise _Refused
        return copy.deepcopy(expr), 0
    if kind == "FUNCTION":
        if expr.get("function_name") not in _SCALARS:
            raise _Refused
    elif not _is_plain(expr):
        raise _Refused
    new = copy.deepcopy(expr)
    found = 0
    for slot, child in _child_slots(new):
        mapped, inner = _mapped(child, tables, keys, aliases)
        slot(mapped)
        found += inner
    return new, found


def _is_plain(expr: dict[str, Any]) -> bool:
    """True for an operator, comparison, cast or constant: the same for the same
    arguments."""
    kind = expr.get("class")
    return kind in _PLAIN or (kind == "OPERATOR" and expr.get("type") in _OPERATORS)


def _is_aggregate_call(expr: dict[str, Any]) -> bool:
    return str(expr.get("function_name", "")).lower() in _AGGREGATE_NAMES


def _arguments(expr: dict[str, Any]) -> list[Any]:
    """A function's arguments in either of DuckDB's serialisations (2.x `arguments`,
    1.x `children`)."""
    if "arguments" in expr:
        return [a["expression"] for a in expr["arguments"]]
    return list(expr["children"])


def _children(expr: dict[str, Any]) -> list[Any]:
    return [child for _, child in _child_slots(expr)]


def _child_slots(expr: dict[str, Any]) -> list[tuple[Any, Any]]:
    """(set it, child) for each sub-expression of `expr`, by the fields DuckDB serialises
    them in."""
    slots: list[tuple[Any, Any]] = []
    for field in ("left", "right", "child", "input", "lower", "upper"):
        if field in expr and isinstance(expr[field], dict):
            slots.append((functools.partial(expr.__setitem__, field), expr[field]))
    for i, child in enumerate(expr.get("children", [])):
        slots.append((functools.partial(expr["children"].__setitem__, i), child))
    for argument in expr.get("arguments", []):
        slots.append((functools.partial(argument.__setitem__, "expression"),
                      argument["expression"]))
    return slots


def _summaries_table(alias: str) -> dict[str, Any]:
    """The FROM clause of `_SUMMARIES`, named `alias` (so that ``metrics.run`` or
    ``m.run`` still reads)."""
    table: dict[str, Any] = json.loads(_template(_SUMMARIES))["statements"][0]["node"][
        "from_table"]
    table["alias"] = alias
    return table


def _name(item: dict[str, Any]) -> str:
    """The column name DuckDB gives `item` as written (the text of the expression)."""
    text = _deserialized(_select_of(copy.deepcopy(item)))
    if text is None or not text.startswith("SELECT "):
        raise _Refused
    return text.removeprefix("SELECT ").rstrip(";")


@functools.lru_cache(maxsize=16)
def _template(text: str) -> str:
    tree = parse_tree(text if text.startswith("SELECT ") else f"SELECT {text}")
    if tree is None:
        raise _Refused
    return json.dumps(tree)


def _expression(text: str) -> dict[str, Any]:
    """The parse tree of the expression `text`."""
    tree = json.loads(_template(text))
    item: dict[str, Any] = tree["statements"][0]["node"]["select_list"][0]
    return item


def _select_of(item: dict[str, Any]) -> dict[str, Any]:
    """The tree of ``SELECT item`` (nothing else)."""
    tree = json.loads(_template("1"))
    tree["statements"][0]["node"]["select_list"] = [item]
    return dict(tree)


def _deserialized(tree: dict[str, Any]) -> str | None:
    import duckdb

    try:
        with parsing() as parser:
            row = parser.execute("SELECT json_deserialize_sql($1::JSON)",
                                 [json.dumps(tree)]).fetchone()
    except duckdb.Error:
        return None
    return str(row[0]) if row and row[0] else None
