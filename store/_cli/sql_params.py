"""`tracklake sql --param NAME=VALUE`: the read side's parameter rule
(`tracklake._read.sql_params`), its refusals as usage errors."""

from __future__ import annotations

import click

from tracklake._read.sql_params import ParamError
from tracklake._read.sql_params import sql_params as _values


def sql_params(statement: str, given: tuple[str, ...]) -> dict[str, str]:
    """The values of `given` that `statement` names; a refusal is a click UsageError."""
    try:
        return _values(statement, given)
    except ParamError as exc:
        raise click.UsageError(str(exc)) from exc
