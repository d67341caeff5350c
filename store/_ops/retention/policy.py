"""Retention policies: the `[retention]` section of ``ROOT/tracklake.toml`` (or another
file) and the CLI flags that override it (docs/lifecycle.md)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from tracklake._errors import StoreError
from tracklake._format.files import read_regular

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

#: The policy file read from the store root when no other is given.
POLICY_FILE = "tracklake.toml"
#: Kinds `drop_after` may drop: everything but metrics, configs and events.
DROPPABLE_KINDS = ("traces", "generations", "texts", "artifacts", "histograms", "media")
#: What `drop_after` drops unless `drop_kinds` says (histograms, which keep their
#: statistics as metrics, and media are kept unless named).
DEFAULT_DROP_KINDS = ("traces", "generations", "texts", "artifacts")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b?)\s*$", re.IGNORECASE)


class PolicyError(StoreError, ValueError):
    """A retention policy (file or flags) is malformed."""


#: The largest duration and size a policy may name: a thousand years, 2**63 - 1 bytes.
MAX_DURATION_SECONDS = 1000 * 365 * 86400.0
MAX_SIZE_BYTES = (1 << 63) - 1
#: The most of a policy file read (it is a few lines).
MAX_POLICY_BYTES = 1 << 20


def parse_duration(text: object, what: str) -> float:
    """Seconds in ``"90d"``, ``"12h"``, ``"30m"``, ``"45s"``, ``"2w"`` (or a number), at
    most `MAX_DURATION_SECONDS`."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        m = _DURATION.match(text) if isinstance(text, str) else None
        if m is None:
            raise PolicyError(f"{what}: {text!r} is not a duration such as '90d', '12h', "
                              "'30m', '45s' or '2w'")
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    if not 0 <= seconds <= MAX_DURATION_SECONDS:  # also refuses NaN and inf
        raise PolicyError(f"{what}: {_shown(text)} is not a duration from 0 to 1000 years")
    return seconds


def parse_size(text: object, what: str) -> int:
    """Bytes in ``"500GB"``, ``"1.5GiB"``, ``"100MB"``, ``"4096"`` (or a number), at most
    `MAX_SIZE_BYTES`."""
    if isinstance(text, int) and not isinstance(text, bool):
        if not 0 <= text <= MAX_SIZE_BYTES:
            raise PolicyError(f"{what}: {_shown(text)} is not a size from 0 to 8 EiB")
        return text
    m = _SIZE.match(text) if isinstance(text, str) else None
    if m is None:
        raise PolicyError(f"{what}: {_shown(text)} is not a size such as '500GB', "
                          "'1.5GiB' or '4096'")
    unit = m.group(2).lower()
    power = "kmgtp".find(unit[0]) + 1 if unit and unit[0] != "b" else 0
    base = 1024 if "i" in unit else 1000
    number = m.group(1)
    if power == 0 and number.isdigit() and len(number) < 30:
        exact = int(number)  # bytes as written, not through a float
        if exact > MAX_SIZE_BYTES:
            raise PolicyError(f"{what}: {_shown(text)} is not a size from 0 to 8 EiB")
        return exact
    size = float(number) * base**power
    if not 0 <= size < 2.0**63:
        raise PolicyError(f"{what}: {_shown(text)} is not a size from 0 to 8 EiB")
    return int(size)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}… ({len(text)} characters)"


@dataclass(frozen=True)
class BestRule:
    """Keep the best `k` runs of each project by the max (or min) of one metric."""

    metric: str
    mode: str = "max"
    k: int = 1


@dataclass(frozen=True)
class Policy:
    """What retention keeps and removes; None switches a rule off."""

    keep_last: int | None = None  # runs per project, newest first
    max_age: float | None = None  # seconds since a run ended
    max_size: int | None = None  # bytes of run data and blobs in the whole store
    best: BestRule | None = None
    drop_after: float | None = None  # seconds since a run ended
    drop_kinds: tuple[str, ...] = DEFAULT_DROP_KINDS
    downsample_after: float | None = None  # seconds since a run ended
    downsample_every: int = 10
    require_backup: bool = False  # refuse to remove data no recorded backup holds

    def is_empty(self) -> bool:
        return all(getattr(self, f) is None for f in (
            "keep_last", "max_age", "max_size", "best", "drop_after", "downsample_after"))

    def merged(self, overrides: dict[str, Any]) -> Policy:
        """This policy with the given fields (from CLI flags) replaced; None means unset."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def _int(value: object, what: str, minimum: int, maximum: int = (1 << 31) - 1) -> int:
    if (isinstance(value, bool) or not isinstance(value, int)
            or not minimum <= value <= maximum):
        raise PolicyError(f"{what}: must be an integer from {minimum} to {maximum}, not "
                          f"{_shown(value)}")
    return value


def _require_backup(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(f"{what}: must be true or false, not {_shown(value)}")
    return value


def check_fields(given: dict[str, Any], name: Callable[[str], str]) -> dict[str, Any]:
    """The policy fields in `given`, each validated (`name(key)` names it in an error):
    one validation for the `[retention]` table and the CLI flags alike."""
    known = {f.name for f in fields(Policy)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise PolicyError(f"{name(unknown[0])}: unknown retention key(s) "
                          f"{', '.join(unknown)}; known: {', '.join(sorted(known))}")
    checks: dict[str, Callable[[object, str], Any]] = {
        "keep_last": lambda v, w: _int(v, w, 0),
        "max_age": parse_duration, "drop_after": parse_duration,
        "downsample_after": parse_duration, "max_size": parse_size,
        "downsample_every": lambda v, w: _int(v, w, 2),
        "drop_kinds": check_drop_kinds, "require_backup": _require_backup,
        "best": best_rule}
    return {key: checks[key](value, name(key)) for key, value in given.items()}


def policy_from_mapping(section: dict[str, Any], where: str) -> Policy:
    """A Policy from the `[retention]` table of a TOML file; PolicyError naming the key."""
    return Policy(**check_fields(section, lambda key: f"{where}: {key}"))


def check_drop_kinds(kinds: object, what: str) -> tuple[str, ...]:
    if not isinstance(kinds, (list, tuple)) or not kinds or not all(
            k in DROPPABLE_KINDS for k in kinds):
        raise PolicyError(f"{what}: must be a non-empty list of {', '.join(DROPPABLE_KINDS)} "
                          f"(metrics, configs and events are never dropped), not {kinds!r}")
    return tuple(kinds)


def best_rule(value: object, what: str) -> BestRule:
    """A BestRule from ``{metric = "critic/score/mean", mode = "max", k = 3}`` or from the
    CLI form ``"max critic/score/mean 3"``."""
    if isinstance(value, str):
        words = value.split()
        if len(words) != 3 or not words[2].isdigit():
            raise PolicyError(f"{what}: {value!r} is not 'max|min METRIC K'")
        value = {"mode": words[0], "metric": words[1], "k": int(words[2])}
    if not isinstance(value, dict) or not isinstance(value.get("metric"), str):
        raise PolicyError(f"{what}: needs metric = \"KEY\" (and mode, k), not {value!r}")
    mode = value.get("mode", "max")
    if mode not in ("max", "min"):
        raise PolicyError(f"{what}: mode must be 'max' or 'min', not {mode!r}")
    extra = set(value) - {"metric", "mode", "k"}
    if extra:
        raise PolicyError(f"{what}: unknown key(s) {', '.join(sorted(extra))}")
    return BestRule(value["metric"], mode, _int(value.get("k", 1), f"{what}: k", 1))


def load_policy(root: Path, path: Path | None = None) -> Policy:
    """The `[retention]` policy of `path`, else of ``ROOT/tracklake.toml`` (an empty
    policy when that file does not exist). The file is read as input from outside: a
    regular file of at most `MAX_POLICY_BYTES`, never followed into a FIFO or device."""
    chosen = path if path is not None else root / POLICY_FILE
    try:
        # a file named on the command line may be a link; the store's own is never followed
        raw = read_regular(chosen.resolve() if path is not None else chosen,
                           MAX_POLICY_BYTES)
    except FileNotFoundError:
        if path is not None:
            raise PolicyError(f"policy file {chosen} does not exist") from None
        return Policy()
    except OSError as exc:
        raise PolicyError(f"policy file {chosen} cannot be read: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise PolicyError(f"{chosen}: not valid TOML ({why})") from None
    section = data.get("retention", {})
    if not isinstance(section, dict):
        raise PolicyError(f"{chosen}: [retention] must be a table")
    return policy_from_mapping(section, str(chosen))
