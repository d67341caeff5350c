"""What a run records about itself once at start, with secrets redacted."""

from __future__ import annotations

import json
import os
import platform
import re
import sys
from collections.abc import Mapping
from typing import Any

from tracklake._format.liveness import process_identity

REDACTED = "<redacted>"

# -- the one rule for names: config keys, environment variables, command-line options ----
#
# A name is split into lower-case words (at any non-alphanumeric character and at
# camelCase humps: ``db.pass`` -> db, pass; ``MY_SERVICE_PAT`` -> my, service, pat;
# ``wandbKey`` -> wandb, key). It names a secret when
#  - a STRONG word is anywhere in it (or a glued word ends with one of the
#    _STRONG_SUFFIXES: ``OPENAIAPIKEY``, ``PGPASSWORD``, ``AWSSECRETKEY``),
#    unless its last word says the value describes the secret rather than holds it
#    (``password_min_length``, ``secret_name``, ``credentials_file``); or
#  - its last word (a trailing ``id`` aside, so ``AWS_ACCESS_KEY_ID``) is a WEAK word:
#    words that are secrets at the end of a name and ordinary elsewhere (``key_dim``);
#    ``pad_token`` / ``eos_token`` (tokenizer tokens) and ``prompt_key`` / ``image_key``
#    (dataset column names, as in verl's ``data.prompt_key``) are not secrets.
# Plurals that count things (``max_tokens``, ``num_keys``) and other words that merely
# start like a secret word (``tokenizer``, ``keyword``, ``passes``, ``secretary``) are
# different words, so they never match.
_STRONG = frozenset({
    "secret", "password", "passwd", "passphrase", "credential", "credentials", "creds",
    "cookie", "cookies", "apikey", "privatekey", "webhook", "webhooks", "auth",
    "authorization", "bearer",
})
_STRONG_SUFFIXES = ("token", "secret", "password", "passwd", "passphrase", "apikey",
                    "secretkey", "accesskey", "privatekey", "authkey", "sshkey")
_WEAK = frozenset({
    "key", "token", "pass", "pwd", "pat", "session", "private", "signature", "dsn",
    "secrets", "passwords", "passcode", "pin", "otp", "jwt", "sas",
})
_DESCRIBES = frozenset({
    "dim", "dims", "size", "len", "length", "count", "num", "number", "path", "file",
    "filename", "dir", "type", "name", "idx", "index", "limit", "budget", "enabled",
    "required", "mode", "method", "provider", "scheme", "min", "max",
})
_NOT_SECRET_TOKEN = frozenset({  # <word>_token names a tokenizer's special token
    "pad", "eos", "bos", "unk", "sep", "cls", "mask", "start", "end", "stop", "special",
    "image", "video", "audio", "vision", "placeholder", "decoder", "begin", "think",
    "tool", "default", "split", "boi", "eoi", "next", "first", "last", "new",
})
_NOT_SECRET_KEY = frozenset({  # <word>_key names a column, field or lookup key
    "prompt", "response", "image", "images", "video", "videos", "audio", "input",
    "output", "label", "labels", "text", "chosen", "rejected", "answer", "question",
    "query", "reward", "fn", "data", "sort", "primary", "foreign", "cache", "metric",
    "column", "feature", "target", "message", "messages", "content", "role", "group",
    "partition", "join", "hash", "rng", "prng", "seed", "lookup", "index", "dataset",
    "field", "source", "tool", "extra", "dict", "map", "value", "sample", "id",
})
_WORD_BREAK = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SECRET_VALUE = re.compile(
    r"(?i:bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}"
    r"|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}"
    r"|\bhf_[A-Za-z0-9]{20,}"
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
    # webhook URLs are credentials: whoever has one can post
    r"|https?://hooks\.slack\.com/\S+"
    r"|https?://(?:[\w-]+\.)*discord(?:app)?\.com/api/webhooks/\S+"
    r"|https?://[\w.-]*webhook\.office\.com/\S+"
)
#: ``scheme://user:password@`` -> the password.
_URL_PASSWORD = re.compile(r"(://[^/\s:@]+):[^/\s@]+@")
#: ``"name": value`` in JSON nested too deeply to parse.
_JSON_PAIR = re.compile(r'"(?P<name>(?:[^"\\]|\\.)*)"(?P<sep>\s*:\s*)'
                        r'(?P<value>"(?:[^"\\]|\\.)*"|[^\s,\]}]+)')
#: ``name=value`` / ``name: value`` inside a value (URL queries, connection strings).
#: A match starts only where a run of name characters does (the name is the run from its
#: first letter): started anywhere, a failed match was retried from every character of
#: the run, which took 4.5 s for a config string of 20,000 letters, and hours for 1 MB.
_PAIR = re.compile(r"(?<![\w.-])(?P<run>[\w.-]+)(?P<sep>\s*[=:]\s*)"
                   r"(?P<value>[^\s&;,'\"?=]+)")
_NAME_START = re.compile(r"[A-Za-z]")


def _words(name: str) -> list[str]:
    return [w.lower() for w in _WORD_BREAK.split(name) if w]


def secret_name(name: str) -> bool:
    """True if a config key, environment variable or command-line option of this name
    may hold a secret (the rule is described above)."""
    words = _words(name)
    if not words:
        return False
    strong = [w in _STRONG or any(w.endswith(x) and (len(w) > len(x) or x not in _WEAK)
                                  for x in _STRONG_SUFFIXES) for w in words]
    if any(strong) and (len(words) == 1 or words[-1] not in _DESCRIBES):
        return True
    if len(words) > 1 and words[-1] in ("id", "ids") and words[-2] in ("key", "session"):
        words = words[:-1]
    last, before = words[-1], words[-2] if len(words) > 1 else ""
    if last not in _WEAK:
        return False
    if last == "token" and before in _NOT_SECRET_TOKEN:
        return False
    if last == "key" and before in _NOT_SECRET_KEY:
        return False
    return not (last == "pwd" and len(words) == 1)  # $PWD is the working directory


def secret_key(key: str) -> bool:
    """True if a config key or command-line option names a secret (``api_key``,
    ``--db-pass``); the same rule as `secret_name`."""
    return secret_name(key)


def redact_value(value: str) -> str:
    """`value` with credential-looking parts replaced: known token shapes, webhook URLs,
    URL passwords, ``name=value`` pairs with a secret name, and the secrets of a JSON
    object or list."""
    structured = _redact_structured(value)
    return _redact_text(value) if structured is None else structured


def _redact_text(value: str) -> str:
    value = _URL_PASSWORD.sub(rf"\1:{REDACTED}@", value)
    value = _SECRET_VALUE.sub(REDACTED, value)
    return _PAIR.sub(_redact_pair, value)


def _redact_pair(m: re.Match[str]) -> str:
    run = m.group("run")
    letter = _NAME_START.search(run)
    if letter is None or m.group("value") == REDACTED or not secret_name(
            run[letter.start():]):
        return m.group(0)
    return f"{run}{m.group('sep')}{REDACTED}"


def _redact_json_pair(m: re.Match[str]) -> str:
    if m.group("value") in ("null", '""', "true", "false") or not secret_name(
            m.group("name")):
        return m.group(0)
    return f'"{m.group("name")}"{m.group("sep")}{json.dumps(REDACTED)}'


def _redact_structured(value: str) -> str | None:
    """A JSON object or list in `value`, its secrets redacted; None if it is not one or
    holds nothing to redact. One nested too deeply to walk (an environment variable can
    hold anything) has its ``"name": value`` pairs redacted as text."""
    text = value.strip()
    if not text.startswith(("{", "[")):
        return None
    try:
        doc = json.loads(text)
        redacted = _redact_nested("", doc)
    except RecursionError:
        return _redact_text(_JSON_PAIR.sub(_redact_json_pair, value))
    except ValueError:
        return None
    return None if redacted == doc else json.dumps(redacted)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: REDACTED if secret_name(k) and v else redact_value(v)
            for k, v in sorted(env.items())}


def redact_argv(argv: list[str]) -> list[str]:
    """Command line with the values of secret-named options redacted (``--db-pass X``,
    ``--db-pass=X``, ``wandb.api_key=X``), and credential-looking values."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("--"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        name, eq, value = arg.partition("=")
        if eq and not name.startswith(("{", "[")) and " " not in name:
            out.append(f"{name}={REDACTED}" if secret_name(name) and value
                       else f"{name}={redact_value(value)}")
        elif arg.startswith("-") and secret_name(arg):
            out.append(arg)
            hide_next = True
        else:
            out.append(redact_value(arg))
    return out


def redact_config(flat: Mapping[str, Any]) -> dict[str, Any]:
    """A flattened config with secret-named keys and credential-looking strings redacted."""
    return {key: _redact_nested(key, value) for key, value in flat.items()}


def _redact_nested(key: str, value: Any) -> Any:
    # None, "" and booleans (``private: true``) cannot carry a secret
    if key and secret_name(key) and value not in (None, "") and not isinstance(value, bool):
        return REDACTED
    if isinstance(value, str):
        return redact_value(value)
    if isinstance(value, Mapping):
        return {k: _redact_nested(f"{key}/{k}" if key else str(k), v)
                for k, v in value.items()}
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
    """Installed distributions and their versions.

    Read from the first lines of each distribution's METADATA (where the core metadata
    puts Name and Version): parsing the whole file with `email` as
    `importlib.metadata` does took 0.17 s for 140 distributions, 14 times longer.
    """
    import importlib.metadata

    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name, version = _name_and_version(
            dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "")
        if name and version:
            found[name] = version
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


def _name_and_version(metadata: str) -> tuple[str | None, str | None]:
    """Name and Version from the header of a core metadata file (it ends at a blank line)."""
    name = version = None
    for line in metadata.splitlines():
        if not line:
            break
        if line.startswith("Name:"):
            name = line[5:].strip()
        elif line.startswith("Version:"):
            version = line[8:].strip()
        if name and version:
            break
    return name, version


def capture(*, env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The identity of this process, redacted, as a JSON-able dict."""
    cwd = os.getcwd()
    return {
        "command": redact_argv([sys.executable, *sys.argv]),
        "cwd": cwd,
        "git": git_state(cwd),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        **process_identity(),  # host, boot and PID namespace, pid, start time
        "gpus": gpus(),
        "packages": packages(),
        "env": redact_env(env),
    }
