"""Run and project ids as the user typed them, read as the ids `init()` stores for them
(``my run 1`` → ``my_run_1``, ``a/b`` → ``a_b``; docs/concepts.md), so every option that
selects runs finds them by the names given at `init`, as `show` does."""

from __future__ import annotations

from typing import Any

import click

from tracklake._errors import InvalidNameError
from tracklake._format.naming import safe_name


def stored_id(name: str, what: str) -> str:
    """`name` as `init()` stores a `what` ("run", "project") id; as given if `init()`
    would refuse it (then it names no run, and the command says so)."""
    try:
        return safe_name(name, what)
    except InvalidNameError:
        return name


def _stored(what: str, convert: bool = True) -> Any:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            return None
        if "" in (value if isinstance(value, tuple) else (value,)):
            # (`--project "$P"` with P unset would select every run)
            raise click.BadParameter(f"an empty {what} id names no {what}; leave the "
                                     "option out to take every one")
        if not convert:
            return value
        if isinstance(value, tuple):
            return tuple(stored_id(v, what) for v in value)
        return stored_id(value, what)

    return callback


#: Click callbacks for options that take run / project ids.
stored_runs = _stored("run")
stored_projects = _stored("project")
#: For options whose command finds the run by either name itself (`find_run`): an empty
#: id refused, the others passed as typed.
given_runs = _stored("run", convert=False)
given_projects = _stored("project", convert=False)
