"""`tracklake ui`: serve a read-only dashboard of the store until Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from tracklake._ui.server import Dashboard

#: Not 8080 or 8888 (often taken by other local servers); --port 0 takes any free port.
DEFAULT_PORT = 7373


@click.command()
@click.option("--root", type=click.Path(file_okay=False), default=None,
              help="Store directory (default: $TRACKLAKE_ROOT, else ./tracklake-store).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Any address but loopback needs the token that "
                   "the printed URL carries.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: any free port).")
def ui(root: str | None, host: str, port: int) -> None:
    """Serve a read-only dashboard of the store (charts, runs, SQL) at a local URL; it
    follows live runs. Ctrl-C (or SIGTERM) stops it."""
    import os

    from tracklake._cli.main import CliError, _store
    from tracklake._read.location import is_url
    from tracklake._read.readonly import free_memory_promptly
    from tracklake._ui.server import Dashboard

    given = root if root is not None else os.environ.get("TRACKLAKE_ROOT")
    if given and is_url(given):
        raise CliError(f"tracklake ui serves a store directory, and {given} is a URL: "
                       "read it with `tracklake sql` or `tracklake runs`, or copy it to a "
                       "directory first")
    store = _store(root)
    try:
        dashboard = Dashboard(store, host=host, port=port)
    except OSError as exc:
        hint = " (try another --port, or --port 0)" if port else ""
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}"
                       ) from exc
    free_memory_promptly()  # a process of its own, answering in bursts
    click.echo(f"tracklake ui: serving {store} (read-only) at")
    click.echo(f"  {dashboard.url}")
    if dashboard.token is not None:
        click.echo("  not a loopback address: requests without this token are refused")
    click.echo("Ctrl-C stops it.", nl=True)
    previous = _stop_on_sigterm()
    try:
        dashboard.start().wait()
    except KeyboardInterrupt:
        pass
    finally:
        try:
            _close(dashboard)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    click.echo("tracklake ui: stopped")


def _close(dashboard: Dashboard) -> None:
    """Close `dashboard`, which answers the questions that arrived whole (each within its
    query limit); a second Ctrl-C or SIGTERM meanwhile interrupts them."""
    if answering := dashboard.answering():
        click.echo(f"tracklake ui: stopping; answering {answering} question(s) in progress "
                   "(Ctrl-C again interrupts them)")
    try:
        dashboard.close()
    except KeyboardInterrupt:
        click.echo("tracklake ui: interrupting the questions in progress")
        dashboard.interrupt()
        dashboard.close()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop_on_sigterm() -> Any:
    """Have SIGTERM (a service manager's stop, `kill`) stop the server as Ctrl-C does;
    the handler it replaces (None off the main thread, where none can be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _interrupt)
