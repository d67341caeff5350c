"""Retention policies: the `[retention]` section of ``ROOT/tracklake.toml`` (or another
file) and the CLI flags that override it (docs/lifecycle.md)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from tracklake._errors import StoreError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

#: The policy file read from the store root when no other is given.
POLICY_FILE = "tracklake.toml"
#: Kinds `drop_after` drops by default: everything but metrics, configs and events.
DROPPABLE_KINDS = ("traces", "generations", "texts", "artifacts")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b?)\s*$", re.IGNORECASE)


class PolicyError(StoreError, ValueError):
    """A retention policy (file or flags) is malformed."""


def parse_duration(text: object, what: str) -> float:
    """Seconds in ``"90d"``, ``"12h"``, ``"30m"``, ``"45s"``, ``"2w"`` (or a number)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool) and text >= 0:
        return float(text)
    m = _DURATION.match(text) if isinstance(text, str) else None
    if m is None:
        raise PolicyError(f"{what}: {text!r} is not a duration such as '90d', '12h', '30m', "
                          "'45s' or '2w'")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2)]


def parse_size(text: object, what: str) -> int:
    """Bytes in ``"500GB"``, ``"1.5GiB"``, ``"100MB"``, ``"4096"`` (or a number)."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    m = _SIZE.match(text) if isinstance(text, str) else None
    if m is None:
        raise PolicyError(f"{what}: {text!r} is not a size such as '500GB', '1.5GiB' or "
                          "'4096'")
    unit = m.group(2).lower()
    power = "kmgtp".find(unit[0]) + 1 if unit and unit[0] != "b" else 0
    base = 1024 if "i" in unit else 1000
    return int(float(m.group(1)) * base**power)


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
    drop_kinds: tuple[str, ...] = DROPPABLE_KINDS
    downsample_after: float | None = None  # seconds since a run ended
    downsample_every: int = 10
    require_backup: bool = False  # refuse to remove data no recorded backup holds

    def is_empty(self) -> bool:
        return all(getattr(self, f) is None for f in (
            "keep_last", "max_age", "max_size", "best", "drop_after", "downsample_after"))

    def merged(self, overrides: dict[str, Any]) -> Policy:
        """This policy with the given fields (from CLI flags) replaced; None means unset."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def _int(value: object, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PolicyError(f"{what}: must be an integer >= {minimum}, not {value!r}")
    return value


def policy_from_mapping(section: dict[str, Any], where: str) -> Policy:
    """A Policy from the `[retention]` table of a TOML file; PolicyError naming the key."""
    known = {f.name for f in fields(Policy)}
    unknown = sorted(set(section) - known)
    if unknown:
        raise PolicyError(f"{where}: unknown retention key(s) {', '.join(unknown)}; known: "
                          f"{', '.join(sorted(known))}")
    out: dict[str, Any] = {}
    for key in ("keep_last",):
        if key in section:
            out[key] = _int(section[key], f"{where}: {key}", 0)
    for key in ("max_age", "drop_after", "downsample_after"):
        if key in section:
            out[key] = parse_duration(section[key], f"{where}: {key}")
    if "max_size" in section:
        out["max_size"] = parse_size(section["max_size"], f"{where}: max_size")
    if "downsample_every" in section:
        out["downsample_every"] = _int(section["downsample_every"],
                                       f"{where}: downsample_every", 2)
    if "drop_kinds" in section:
        out["drop_kinds"] = check_drop_kinds(section["drop_kinds"], f"{where}: drop_kinds")
    if "require_backup" in section:
        if not isinstance(section["require_backup"], bool):
            raise PolicyError(f"{where}: require_backup must be true or false, not "
                              f"{section['require_backup']!r}")
        out["require_backup"] = section["require_backup"]
    if "best" in section:
        out["best"] = best_rule(section["best"], f"{where}: best")
    return Policy(**out)


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
    policy when that file does not exist)."""
    chosen = path if path is not None else root / POLICY_FILE
    try:
        raw = chosen.read_bytes()
    except FileNotFoundError:
        if path is not None:
            raise PolicyError(f"policy file {chosen} does not exist") from None
        return Policy()
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{chosen}: not valid TOML ({exc})") from exc
    section = data.get("retention", {})
    if not isinstance(section, dict):
        raise PolicyError(f"{chosen}: [retention] must be a table")
    return policy_from_mapping(section, str(chosen))
