"""The run (and project) a question's SQL is restricted to, read from DuckDB's own parse
tree, so that a question about one run reads that run's files only.

Only a shape whose answer cannot depend on any other run counts: one SELECT of one of
tracklake's views (no join, set operation, CTE, sample or subquery anywhere: a sample
drawn before the WHERE would draw from other rows) whose WHERE clause is ``run =
'literal'`` or has it as one of its top-level AND terms (likewise ``project``), or a
SELECT from nothing but such a SELECT. Every row the view holds of another run fails
that WHERE, so the view holding that run's rows only gives the same answer. Anything
else, or a parse tree of a shape this code does not know (another DuckDB version),
restricts nothing.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tracklake._errors import InvalidNameError
from tracklake._format.naming import safe_name
from tracklake._read.readonly import parsing

if TYPE_CHECKING:
    pass

#: The columns whose equality to a literal narrows what a connection reads.
_NARROWING = ("project", "run")



def parse_tree(sql: str) -> Any:
    """DuckDB's parse tree of `sql` (`json_serialize_sql`), None if it gives none. The
    text is only parsed, on a private connection that reads no table."""
    import duckdb

    try:
        with parsing() as parser:
            row = parser.execute("SELECT json_serialize_sql($1)", [sql]).fetchone()
    except duckdb.Error:
        return None
    try:
        tree = json.loads(row[0]) if row else None
    except (TypeError, ValueError, RecursionError):  # expressions near DuckDB's depth limit
        return None
    return None if not isinstance(tree, dict) or tree.get("error") else tree


def table_names(sql: str) -> set[str] | None:
    """The names (lower case) of every table `sql` reads, from its parse tree (which
    takes statements with parameters, where `duckdb.get_table_names` refuses them); None
    if DuckDB gives no tree."""
    tree = parse_tree(sql)
    if tree is None:
        return None
    names: set[str] = set()
    stack: list[Any] = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("type") == "BASE_TABLE" and isinstance(item.get("table_name"), str):
                names.add(item["table_name"].lower())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return names


def narrowed_to(sql: str, views: set[str], params: Any = None) -> dict[str, str]:
    """{"project": ..., "run": ...} (either or both) that every row of `sql`'s answer
    comes from, if `sql` is one SELECT of one of `views` (lower case) narrowed by them as
    the module says, or a SELECT of nothing but such a SELECT (as `first_rows_sql` wraps
    a statement); {} otherwise. A named parameter (``run = $r``) whose value in `params`
    (a dict, as the query is given it) is a text counts as that literal."""
    tree = parse_tree(sql)
    statements = tree.get("statements") if tree else None
    if not isinstance(statements, list) or len(statements) != 1:
        return {}
    named = {str(k): v for k, v in params.items() if isinstance(v, str)} \
        if isinstance(params, dict) else {}
    return _narrowed(statements[0].get("node"), views, named)


def _narrowed(node: Any, views: set[str], named: dict[str, str]) -> dict[str, str]:
    if not isinstance(node, dict) or node.get("type") != "SELECT_NODE" or \
            node.get("cte_map", {}).get("map") or node.get("sample") or \
            holds_subquery(node):
        return {}
    table = node.get("from_table")
    if isinstance(table, dict) and table.get("type") == "SUBQUERY" and \
            not table.get("sample") and isinstance(table.get("subquery"), dict):
        # the outer SELECT reads the inner one's answer alone: it can only drop, shape
        # or order those rows
        return _narrowed(table["subquery"].get("node"), views, named)
    if not isinstance(table, dict) or table.get("type") != "BASE_TABLE" or \
            table.get("schema_name") or table.get("catalog_name") or \
            table.get("column_name_alias") or table.get("sample") or \
            str(table.get("table_name", "")).lower() not in views:
        return {}
    names = {str(table["table_name"]).lower(), str(table.get("alias") or "").lower()} - {""}
    where = node.get("where_clause")
    terms = where.get("children", []) if isinstance(where, dict) and \
        where.get("type") == "CONJUNCTION_AND" else [where]
    found: dict[str, str] = {}
    for term in terms:
        column, value = _column_equals_literal(term, names, named)
        if column is not None and value is not None:
            if found.get(column, value) != value:
                return {}  # run = 'a' AND run = 'b': no rows, read as written
            found[column] = value
    return found


def holds_subquery(node: Any) -> bool:
    """True if any expression or table below `node` is a subquery, or a table other than
    the one in FROM (a table function, a join)."""
    stack = [v for k, v in node.items() if k != "from_table"] if isinstance(node, dict) \
        else [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("class") == "SUBQUERY" or item.get("type") in (
                    "SUBQUERY", "BASE_TABLE", "TABLE_FUNCTION", "JOIN"):
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _column_equals_literal(term: Any, tables: set[str], named: dict[str, str]
                           ) -> tuple[str | None, str | None]:
    """(column, value) if `term` is ``column = 'value'`` (either way round; or a named
    parameter whose text `named` holds) for a column of `_NARROWING`, unqualified or
    qualified by one of `tables`, and a value that is a stored name; (None, None)
    otherwise."""
    if not isinstance(term, dict) or term.get("type") != "COMPARE_EQUAL":
        return None, None
    for ref, constant in ((term.get("left"), term.get("right")),
                          (term.get("right"), term.get("left"))):
        column = _column(ref, tables)
        value = _string(constant)
        if value is None and isinstance(constant, dict) and \
                constant.get("class") == "PARAMETER":
            value = named.get(str(constant.get("identifier")))
        if column is not None and value is not None:
            try:
                stored = safe_name(value, column)
            except (InvalidNameError, TypeError):
                return None, None
            # a value no stored name has is left to the query (which finds no row)
            return (column, value) if stored == value else (None, None)
    return None, None


def _column(ref: Any, tables: set[str]) -> str | None:
    if not isinstance(ref, dict) or ref.get("class") != "COLUMN_REF":
        return None
    names = [str(n).lower() for n in ref.get("column_names", [])]
    if len(names) == 2 and names[0] in tables:
        names = names[1:]
    return names[0] if len(names) == 1 and names[0] in _NARROWING else None


def _string(constant: Any) -> str | None:
    """The text of a string literal in either of DuckDB's serialisations (2.x: `literal`
    with `kind`; 1.x: `value` with a VARCHAR type); None for anything else."""
    if not isinstance(constant, dict) or constant.get("class") != "CONSTANT":
        return None
    literal = constant.get("literal")
    if isinstance(literal, dict):
        text = literal.get("text")
        return text if literal.get("kind") == "STRING" and isinstance(text, str) else None
    value = constant.get("value")
    if isinstance(value, dict) and not value.get("is_null") and \
            (value.get("type") or {}).get("id") == "VARCHAR" and \
            isinstance(value.get("value"), str):
        return str(value["value"])
    return None
