"""What a run records about itself once at start, with secrets redacted."""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted>"

#: Environment variable names containing one of these (case-insensitive) are redacted.
SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH",
                     "PRIVATE", "COOKIE", "SIGNATURE", "SESSION")
#: Config keys and command-line options whose last word is one of these are redacted.
_SECRET_WORD = re.compile(
    r"(?:^|[_.\-/])(?:api[_-]?key|secret|secret[_-]?key|password|passwd|credentials?|"
    r"access[_-]?key(?:[_-]?id)?|private[_-]?key|"
    r"(?:auth|access|api|bearer|hf|github|gh|refresh|session|secret)[_-]?token)$"
    r"|(?:^|[./])token$",  # a key that is just "token"; pad_token, eos_token are not secrets
    re.IGNORECASE,
)
#: Values that look like credentials whatever their name.
_SECRET_VALUE = re.compile(
    r"(?i:bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}"
    r"|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\bhf_[A-Za-z0-9]{20,}"
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
)
_URL_PASSWORD = re.compile(r"(://[^/\s:@]+):[^/\s@]+@")


def secret_name(name: str) -> bool:
    """True if an environment variable of this name may hold a secret."""
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def secret_key(key: str) -> bool:
    """True if a config key or command-line option names a secret (``api_key``, ``--token``)."""
    return bool(_SECRET_WORD.search(key.lstrip("-")))


def redact_value(value: str) -> str:
    """`value` with credential-looking parts and URL passwords replaced."""
    value = _URL_PASSWORD.sub(rf"\1:{REDACTED}@", value)
    return _SECRET_VALUE.sub(REDACTED, value)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: REDACTED if secret_name(k) else redact_value(v) for k, v in sorted(env.items())}


def redact_argv(argv: list[str]) -> list[str]:
    """Command line with the values of secret-named options redacted."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if eq and secret_key(name):
            out.append(f"{name}={REDACTED}")
        elif arg.startswith("-") and secret_key(arg):
            out.append(arg)
            hide_next = True
        else:
            out.append(redact_value(arg))
    return out


def redact_config(flat: Mapping[str, Any]) -> dict[str, Any]:
    """A flattened config with secret-named keys and credential-looking strings redacted."""
    return {key: _redact_nested(key, value) for key, value in flat.items()}


def _redact_nested(key: str, value: Any) -> Any:
    if secret_key(key) and value not in (None, ""):
        return REDACTED
    if isinstance(value, str):
        return redact_value(value)
    if isinstance(value, Mapping):
        return {k: _redact_nested(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_nested("", v) for v in value]
    return value


def _run(cmd: list[str], cwd: str) -> str | None:
    import subprocess

    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=5,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(cwd: str) -> dict[str, Any] | None:
    """Commit, branch, dirty flag and remote of the git work tree at `cwd`, if any."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd)
    if commit is None:
        return None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd)
    remote = _run(["git", "config", "--get", "remote.origin.url"], cwd)
    return {
        "commit": commit,
        "branch": _run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd),
        "dirty": bool(status),
        "remote": redact_value(remote) if remote else None,
    }


def gpus() -> list[dict[str, str]]:
    """Visible GPUs from nvidia-smi, without importing torch."""
    out = _run(["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version",
                "--format=csv,noheader"], os.getcwd())
    if not out:
        return []
    fields = ("index", "name", "memory", "driver")
    return [dict(zip(fields, (p.strip() for p in line.split(",")), strict=False))
            for line in out.splitlines()]


def packages() -> dict[str, str]:
    """Installed distributions and their versions."""
    import importlib.metadata

    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[name] = dist.version
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


def capture(*, env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The identity of this process, redacted, as a JSON-able dict."""
    cwd = os.getcwd()
    return {
        "command": redact_argv([sys.executable, *sys.argv]),
        "cwd": cwd,
        "git": git_state(cwd),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "gpus": gpus(),
        "packages": packages(),
        "env": redact_env(env),
    }
