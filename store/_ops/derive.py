"""The run catalog and bundles brought up to date as runs finish, so that the first
question after the writers finds them as the tenth does, instead of deriving them for
every run at once (store/_read/catalog.py, store/_ops/bundle.py).

A finished run's compactor (store/_ops/auto.py) calls `start`: it records when the last
run settled (``.cache/bundles/.wanted``) and, unless a deriver runs already, starts
``python -m tracklake._ops.derive ROOT``, detached and at low priority. One deriver at a
time holds the ``.deriving`` claim; it waits until what had settled when it looked is
older than a reader's `RACY_SECONDS` (younger files are not catalogued) and until
`BUILD_EVERY_SECONDS` after the last build (so that a sweep's bundles hold many runs
each), then runs the bundle builder, which catalogs every settled run and bundles the
small ones. It does so again while runs keep settling (one build each
`BUILD_EVERY_SECONDS` or so during a sweep); once none did since its last build it
leaves, and looks at ``.wanted`` once more after letting go of its claim, so a run that
settled at that moment is not left to the readers. A build a reader began since counts.

Everything derived only saves readers time: killed at any point, a deriver leaves what a
killed builder leaves, and readers derive what is missing themselves.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from tracklake._format import bounded_json
from tracklake._format.files import read_state, write_state
from tracklake._ops.bundle import background_main, build_bundles, last_build
from tracklake._ops.claims import (
    CLAIM_STALE_SECONDS,
    DERIVING,
    hold_claim,
    owner_is_gone,
    touch_claim,
)
from tracklake._read.bundles import BUILD_EVERY_SECONDS, BUNDLE_DIR, enabled
from tracklake._read.decoded import RACY_SECONDS

#: When the last run settled: ``{"at": epoch seconds}``.
WANTED = ".wanted"
#: The claim of the one deriver at work.
CLAIM = DERIVING
#: Slack past `RACY_SECONDS`, for the rounding of file systems' times.
_SLACK_SECONDS = 1.0
#: Times further ahead than this are another host's clock (or planted): taken as now.
_FUTURE_SECONDS = 60.0
#: A deriver leaves after this long; the next run to finish starts another.
MAX_SECONDS = 3600.0
_RETRY_SECONDS = 2.0
#: Longest single sleep, so that a deriver notices a removed store soon.
_NAP_SECONDS = 10.0


def _rel(name: str) -> str:
    return f"{BUNDLE_DIR.as_posix()}/{name}"


def want(root: Path, at: float | None = None) -> None:
    """Record that a run settled `at` (now if not given)."""
    write_state(root, _rel(WANTED), json.dumps({"at": time.time() if at is None else at}
                                               ).encode(), tidy=True)


def wanted(root: Path) -> float:
    """When the last run settled as `want` recorded it (0 if never, or unreadable)."""
    try:
        at = bounded_json.loads(read_state(root, _rel(WANTED), 4096))["at"]
    except (OSError, ValueError, TypeError, KeyError):
        return 0.0
    if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at):
        return 0.0
    return float(at)


def running(root: Path) -> bool:
    """Whether a live deriver holds the store's claim."""
    claim = root / BUNDLE_DIR / CLAIM
    return os.path.lexists(claim) and not owner_is_gone(claim, root, CLAIM_STALE_SECONDS)


def start(root: Path) -> bool:
    """Record that a run settled now and start a deriver unless one runs (or bundles are
    off); True if one was started. Never waits for it."""
    if not enabled():
        return False
    want(root)
    if running(root):
        return False
    devnull = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
    os.posix_spawn(sys.executable, [sys.executable, "-m", "tracklake._ops.derive",
                                    str(root)], os.environ, file_actions=devnull, setsid=True)
    return True


def derive(root: Path, clock: Callable[[], float] = time.time,
           sleep: Callable[[float], None] = time.sleep) -> int:
    """Build until every settled run `want` recorded is in a build (see the module), for
    at most `MAX_SECONDS`; how many builds it ran (0 too if another deriver holds the
    claim)."""
    deadline = clock() + MAX_SECONDS
    handled, builds = 0.0, 0
    while clock() < deadline and wanted(root) > handled:
        with hold_claim(root / BUNDLE_DIR, CLAIM, root=root) as claim:
            if claim is None:
                return builds  # the deriver that holds it looks at `.wanted` after us
            while clock() < deadline:
                now = clock()
                at = wanted(root)
                if at > now + _FUTURE_SECONDS:  # another host's clock, or planted
                    want(root, now)
                    at = now
                if at <= handled:
                    break
                if not (root / "runs").is_dir():
                    return builds  # the store was removed meanwhile
                catalogable = at + RACY_SECONDS + _SLACK_SECONDS
                began, ended = (t if t <= now + _FUTURE_SECONDS else 0.0
                                for t in last_build(root))
                if began >= catalogable:
                    handled = at  # a builder that began since took it in
                    continue
                # not `.wanted` again while waiting: in a sweep it moves on with every
                # run that ends, and the build would never come
                until = max(catalogable, ended + BUILD_EVERY_SECONDS)
                while (wait := until - clock()) > 0:
                    sleep(min(wait, _NAP_SECONDS))
                    if not (root / "runs").is_dir():
                        return builds
                    touch_claim(claim)
                report = build_bundles(root, touch=partial(touch_claim, claim))
                touch_claim(claim)
                if report.disabled or report.refused is not None:
                    return builds
                if report.busy:  # a reader's builder: it may have begun too early
                    sleep(_RETRY_SECONDS)
                    continue
                handled, builds = at, builds + 1
    return builds


def main(argv: list[str]) -> int:
    """Entry point: ROOT (`bundle.background_main`)."""
    return background_main(argv, "tracklake._ops.derive", derive,
                           "bringing the run catalog and bundles up to date")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
