"""An action's journal (``ROOT/trash/<id>/action.json``), read as input from outside: a
restored backup or another user can plant one, so every field is checked, and every path
it names must be one retention itself writes for that action, inside the store, reached
through no link."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tracklake._format import KINDS, bounded_json
from tracklake._format.files import read_regular
from tracklake._format.naming import safe_name
from tracklake._format.schema import BLOB_KINDS
from tracklake._ops.retention.plan import Action

#: A journal is a few paths and fields; a larger file is not one retention wrote.
MAX_JOURNAL_BYTES = 1 << 20
_BLOB = re.compile(r"blobs/sha256/([0-9a-f]{2})/\1[0-9a-f]{62}")
_VERBS = ("delete", "drop", "downsample")


class JournalError(ValueError):
    """A journal that retention did not write as it stands; it is never acted on."""


def _field(journal: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = journal.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise JournalError(f"field {key!r} is {value!r}")
    return value


def _action(value: object) -> Action:
    if not isinstance(value, dict) or set(value) - set(Action.__dataclass_fields__):
        raise JournalError("field 'action' is not an action")
    verb, project, run = value.get("verb"), value.get("project"), value.get("run")
    if verb not in _VERBS:
        raise JournalError(f"action verb {verb!r}")
    for what, name in (("project", project), ("run", run)):
        if not isinstance(name, str) or safe_name(name, what) != name:
            raise JournalError(f"action {what} {name!r} is not a name of the store")
    kinds = value.get("kinds")
    if not isinstance(kinds, list) or any(k not in KINDS for k in kinds):
        raise JournalError(f"action kinds {kinds!r}")
    size = value.get("bytes")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise JournalError(f"action bytes {size!r}")
    if not all(isinstance(value.get(k), str) for k in ("rule", "why")):
        raise JournalError("action rule and why must be text")
    if not isinstance(value.get("forced", False), bool):
        raise JournalError("action forced must be true or false")
    return Action(**{**value, "kinds": tuple(kinds)})


def allowed_moves(action: Action) -> set[str]:
    """The run directories an action may move to the trash (blobs are checked by shape)."""
    kinds = KINDS if action.verb == "delete" else action.kinds
    run = f"project={action.project}/run={action.run}"
    allowed = {f"{kind}/{run}" for kind in kinds}
    if action.verb == "delete":
        allowed.add(f"runs/{run}")
    return allowed


def read_journal(path: Path) -> dict[str, Any]:
    """The journal at `path`, checked; JournalError saying what does not fit otherwise."""
    try:
        journal = bounded_json.loads(read_regular(path, MAX_JOURNAL_BYTES))
    except (OSError, ValueError, RecursionError) as exc:
        raise JournalError(f"not a readable journal ({exc})") from exc
    if not isinstance(journal, dict):
        raise JournalError("not a JSON object")
    if _field(journal, "id", str) != path.parent.name:
        raise JournalError("its id is not its folder's name")
    action = _action(journal.get("action"))
    allowed = allowed_moves(action)
    blobs = action.verb == "delete" or any(k in BLOB_KINDS for k in action.kinds)
    for rel in _field(journal, "moves", list):
        if not isinstance(rel, str) or not (rel in allowed
                                            or (blobs and _BLOB.fullmatch(rel))):
            raise JournalError(f"it names {rel!r}, not a path this action moves")
    if _field(journal, "blob_bytes", int) < 0:
        raise JournalError("field 'blob_bytes' is negative")
    every = journal.get("every")
    if action.verb == "downsample" and (not isinstance(every, int) or isinstance(every, bool)
                                        or every < 1):
        raise JournalError(f"field 'every' is {every!r}")
    journal["action"] = {**journal["action"], "kinds": list(action.kinds)}
    return journal


