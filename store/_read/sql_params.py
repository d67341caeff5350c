"""Values of a statement's named parameters (``$name``) given as ``NAME=VALUE`` texts, as
`tracklake sql --param` and the dashboard's SQL console take them (the report's SQL uses
``$p``, ``$r``, ``$rank``; a dashboard panel's SQL names its own)."""

from __future__ import annotations

import re

from tracklake._read.readonly import parsing

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ParamError(ValueError):
    """A parameter is malformed, given twice, or named by the statement but not given."""


def sql_params(statement: str, given: tuple[str, ...] | list[str]) -> dict[str, str]:
    """The values of `given` (``NAME=VALUE`` each) that `statement` names. A value is text:
    DuckDB converts it where it meets a column (``rank = $rank``) or a list
    (``list_contains($runs, ...)``, the value written ``[a,b]``); elsewhere cast it
    (``$n::BIGINT``). A parameter the statement does not name is left out (one list of
    parameters serves every query of a report); one it names but was not given, a name
    given twice or a malformed one is a ParamError naming it."""
    import duckdb

    values: dict[str, str] = {}
    for item in given:
        name, sep, value = item.partition("=")
        if not sep or not _NAME.match(name):
            raise ParamError(f"--param {item!r}: write NAME=VALUE, NAME a letter or _ "
                             "then letters, digits or _")
        if name in values:
            raise ParamError(f"--param {name} is given twice")
        values[name] = value
    try:
        with parsing() as parser:
            statements = parser.extract_statements(statement)
    except duckdb.Error:
        return values  # the query itself will say what is wrong with it
    named = {p for s in statements for p in s.named_parameters}
    missing = sorted(named - values.keys())
    if missing:
        raise ParamError("the statement uses " + ", ".join(f"${m}" for m in missing)
                         + ": give " + " ".join(f"--param {m}=VALUE" for m in missing))
    return {name: value for name, value in values.items() if name in named}
