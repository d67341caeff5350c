"""A command run in a real terminal of a given size, and the text it leaves there.

tmux is the terminal: a server of its own (its socket in a temporary directory removed
afterwards, no user configuration, no status line, so the pane is the whole width x
height), the command started in a shell of the pane, and the pane's text, scrolled-off
lines included, read once the command has ended. Colours and styles are dropped; lines
lose their trailing blanks.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence

from _programs import program

#: What every command gets: a UTF-8 terminal (box and block characters).
UTF8 = {"LANG": "C.UTF-8", "LC_ALL": ""}


def run_in_terminal(argv: Sequence[str], width: int, height: int, *,
                    env: Mapping[str, str] | None = None, timeout: float = 120) -> str:
    """The screen (and scrollback) of a `width` x `height` terminal in which `argv` ran to
    its end, with `env` added to the environment."""
    tmux = program("tmux")
    home = tempfile.mkdtemp(prefix="tracklake-tmux-")
    server = [tmux, "-S", os.path.join(home, "socket"), "-f", os.devnull]
    # the size is the terminal's: not COLUMNS or LINES inherited from the test process
    command = shlex.join(["env", "-u", "COLUMNS", "-u", "LINES",
                          *(f"{k}={v}" for k, v in {**UTF8, **(env or {})}.items()), *argv])
    # the pane stays open after the command (its text is read then), and says it ended
    script = f"{command}; tmux wait-for -S ended; exec sleep {int(timeout) + 60}"
    subprocess.run([*server, "start-server", ";", "set-option", "-g", "status", "off", ";",
                    "set-option", "-g", "history-limit", "10000", ";",
                    "new-session", "-d", "-s", "main", "-x", str(width), "-y", str(height),
                    script], check=True)
    try:
        subprocess.run([*server, "wait-for", "ended"], check=True, timeout=timeout)
        screen = subprocess.run([*server, "capture-pane", "-p", "-S", "-", "-E", "-", "-t",
                                 "main"], capture_output=True, text=True, check=True).stdout
    finally:
        subprocess.run([*server, "kill-server"], check=False, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)
    lines = [line.rstrip() for line in screen.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"
