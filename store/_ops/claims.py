"""A stream's `.compacting` claim: one compactor at a time, and a claim left by a killed
compactor known stale (its host, boot id, pid and process start time; from another host,
once this host has watched it stand still for the limit, whatever the clocks say), with
the temporaries such a compactor leaves removed."""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import platform
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tracklake._format import bounded_json
from tracklake._format.files import NotRegularFileError, read_regular, scratch, write_new
from tracklake._format.heartbeats import heartbeat_watch
from tracklake._format.liveness import (
    UNWATCHED_LIMIT_SECONDS,
    clock_skew,
    process_alive,
    process_identity,
    process_known_gone,
)
from tracklake._format.store_clock import store_now_ns

#: A claim from another host (or unreadable) that was not refreshed for this long was left
#: by a compactor that died; on its own host a claim is checked exactly (pid, start time,
#: boot id).
CLAIM_STALE_SECONDS = 600.0


def _claim_record() -> dict[str, object]:
    return {**process_identity(),
            "claimed_at": _dt.datetime.now(_dt.timezone.utc).isoformat()}


def write_owner(path: Path) -> None:
    """Write this process's identity to `path`, so that `owner_is_gone` can tell later
    (written again, it tells that its owner still lives)."""
    path.write_bytes(json.dumps(_claim_record()).encode())


def owner_is_gone(path: Path, root: Path, stale_after: float, *,
                  stand_in: Path | None = None) -> bool:
    """True if the process whose identity `path` holds (`write_owner`) is certainly gone
    (`_holder_gone`); without `path`, judged by `stand_in`'s age as if it were a claim that
    cannot be read (its owner was killed before it wrote `path`)."""
    try:
        contents = read_regular(path, 1 << 16)
        st = path.stat()
    except FileNotFoundError:
        if stand_in is None:
            return True
        path, contents, st = stand_in, b"", stand_in.lstat()
    except OSError:
        contents, st = b"", path.lstat()  # not an owner file at all: judged by its age
    return _holder_gone(path, root, st, contents, stale_after)


def _read_claim(contents: bytes) -> dict[str, Any] | None:
    """The claim's record if it is one this version writes, else None (empty, foreign)."""
    try:
        record = bounded_json.loads(contents)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    types: dict[str, type | tuple[type, ...]] = {
        "pid": int, "host": str, "boot_id": (str, type(None)),
        "start_ticks": (int, type(None))}
    if any(not isinstance(record.get(k), t) for k, t in types.items()):
        return None
    return record


def _holder_gone(path: Path, root: Path | None, st: os.stat_result, contents: bytes,
                 stale_after: float, *, watched_only: bool = False) -> bool:
    """True if the process that wrote `contents` (a claim or an owner file, read from
    `path`, whose stat is `st`) is certainly gone.

    Where its process can be probed (same host, boot and PID namespace:
    `process_known_gone`) this is exact. One from another host or PID namespace (a shared
    file system, a container), or one that cannot be read, is gone once it stood still
    for `stale_after` (`_still_for`): its holder rewrites it while it works."""
    record = _read_claim(contents)
    gone = None if record is None else process_known_gone(record)
    if gone is not None:
        return gone
    return _still_for(path, root, st, contents, stale_after, watched_only=watched_only)


def _take_claim(claim: Path) -> bool:
    """Create the claim exclusively, whole (written aside, then hard-linked into place:
    `link` fails if the name exists, on NFS and Lustre too, where locks may not work)."""
    data = json.dumps(_claim_record()).encode()
    tmp = scratch(claim.with_name(f"{claim.name}.{platform.node()}"), "")
    try:
        write_new(tmp, data)  # a full disk raises here, leaving nothing behind
        try:
            os.link(tmp, claim)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
                raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    # no hard links on this file system: create the claim exclusively and fill it
    try:
        fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
    except OSError:
        claim.unlink()
        raise
    finally:
        os.close(fd)
    return True


def _claim_bytes(path: Path) -> bytes:
    """The contents of claim `path`; none if it is not a regular file (a link, FIFO or
    device planted there is never opened) or too large to be one."""
    try:
        return read_regular(path, 1 << 16)
    except FileNotFoundError:
        raise
    except OSError:
        return b""


def _break_stale_claim(claim: Path, root: Path | None) -> None:
    """Remove a claim whose holder is gone (`_holder_gone`), unless another compactor
    replaced it meanwhile."""
    try:
        before = read_regular(claim, 1 << 16)
        st = claim.stat()
    except FileNotFoundError:
        return
    except OSError:
        before, st = b"", claim.lstat()  # not a claim file at all: judged by its age
    if stat.S_ISDIR(st.st_mode):
        raise NotRegularFileError(
            errno.EISDIR, f"{claim} is a directory, where the store keeps a claim file: "
            "nothing was done, and nothing is removed or written through it; remove it "
            "(`tracklake fsck` lists it)", str(claim))
    if not _holder_gone(claim, root, st, before, CLAIM_STALE_SECONDS, watched_only=True):
        return
    aside = claim.with_name(f"{claim.name}-stale.{platform.node()}.{os.getpid()}.tmp")
    try:
        os.rename(claim, aside)
    except FileNotFoundError:
        return  # another compactor broke it first
    if aside.lstat().st_ino != st.st_ino or _claim_bytes(aside) != before:
        # a live claim made after our look: put it back (fails only if yet another exists)
        with contextlib.suppress(FileExistsError):
            os.link(aside, claim)
    aside.unlink()


def _still_for(claim: Path, root: Path | None, st: os.stat_result, contents: bytes,
               stale_after: float, *, watched_only: bool = False) -> bool:
    """Whether a claim whose holder cannot be probed stood still for longer than
    `stale_after`: by its modification time, allowing the clocks `clock_skew()`; with
    `root`, also as this host watched its file (contents and modification time, which its
    holder refreshes) not change, by this host's clock alone. `watched_only` (with
    `root`) trusts the modification time only once it is `UNWATCHED_LIMIT_SECONDS` old,
    as a writer's heartbeat: clocks hours apart never break a claim that is refreshed."""
    age = time.time() - st.st_mtime
    limit = UNWATCHED_LIMIT_SECONDS if watched_only and root is not None else (
        stale_after + clock_skew())
    if age > limit:
        return True
    if root is None:
        return False
    key = f"claim:{claim.relative_to(root).as_posix()}"
    beat = f"{st.st_mtime_ns}:{st.st_ino}:{contents.hex()[:64]}"
    return heartbeat_watch(root).unchanged_for(key, beat, time.time()) > stale_after


#: The names claims are made under: a stream's compactor (and the bundle builder's, in
#: `.cache/bundles`) or shipper, retention's applier, fsck's repair and the deriver.
COMPACTING, SHIPPING, RETAINING, REPAIRING, DERIVING = (
    ".compacting", ".shipping", ".retaining", ".repairing", ".deriving")
CLAIM_NAMES = frozenset({COMPACTING, SHIPPING, RETAINING, REPAIRING, DERIVING})

#: Temporaries of a claim (a compactor's, a shipper's, retention's, fsck's repair), of a
#: compactor's sorted runs (a directory), and of a part (`.part-...-NNNNNN.parquet.RANDOM.PID.tmp`,
#: `files.scratch`; without RANDOM before).
_CLAIM_TMP = re.compile(
    r"^\.(?:compacting|shipping|retaining|repairing)(?:-stale)?\.(.+?)(?:\.[0-9a-f]{12})?\.(\d+)\.tmp$")
_SORT_TMP = re.compile(r"^\.sort\.(.+)\.(\d+)\.tmp$")
#: A compactor's part being written (`sorted_part.write_sorted_part`): only the holder of
#: a stream's claim writes one.
_COMPACTED_TMP = re.compile(r"^\.part-new\.parquet\.[0-9a-f]{12}\.\d+\.tmp$")
_PART_TMP = re.compile(r"^\.part-.*\.parquet\.(?:[0-9a-f]{12}\.)?(\d+)\.tmp$")


def remove_leftovers(directory: Path, now: float) -> None:
    """Delete, while holding `directory`'s claim, the temporaries of earlier holders
    (their ages by `now`, the time by the clock that stamps their mtimes: another host's
    temporary on a file server is as old as the server says):
    sorted runs and a compacted part being written (only a claim's holder makes them, so
    any found belong to one that is gone, stopped however and whenever), a contender's
    claim aside older than a minute or whose process on this host ended, and another
    part's older than CLAIM_STALE_SECONDS whose process is gone (unpack writes parts
    without a claim, maybe from another host sharing the file system)."""
    host = platform.node()
    for name in os.listdir(directory):
        path = directory / name
        if _SORT_TMP.match(name) is not None:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            continue
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            continue  # none of these is a directory when made here: not ours to remove
        age = now - st.st_mtime
        if _COMPACTED_TMP.match(name) is not None:
            gone = True
        elif (m := _CLAIM_TMP.match(name)) is not None:
            gone = age > 60 or (m.group(1) == host and not process_alive(int(m.group(2))))
        elif (m := _PART_TMP.match(name)) is not None:
            gone = age > CLAIM_STALE_SECONDS and not process_alive(int(m.group(1)))
        else:
            continue
        if gone:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def touch_claim(claim: Path) -> None:
    """Show the claim's holder at work: another host takes a claim it watched stand still
    for `CLAIM_STALE_SECONDS` for a dead holder's, and a deriver or bundle builder holds
    its claim through naps and builds that can last longer. A claim already gone is left
    so."""
    with contextlib.suppress(FileNotFoundError):
        os.utime(claim)


@contextlib.contextmanager
def hold_claim(directory: Path, name: str = COMPACTING,
               leftovers: Callable[[Path, float], None] | None = None,
               root: Path | None = None) -> Iterator[Path | None]:
    """Exclusively claim `directory` (a stream, for one compactor or shipper; the trash,
    for one retention applier) of the store at `root`; yields the claim (None if a live
    process holds it). A claim left by one that died is broken (`_break_stale_claim`;
    with `root`, judged by its watched progress alone, whatever the clocks: see
    `_still_for`); once held, `leftovers(directory, now)` cleans up after it, `now` by
    the clock that stamps the store's mtimes (`store_clock`; this host's without
    `root`)."""
    claim = directory / name
    for _ in range(3):
        if _take_claim(claim):
            try:
                if leftovers is not None:
                    leftovers(directory, time.time() if root is None
                              else store_now_ns(root) / 1e9)
                yield claim
            finally:
                with contextlib.suppress(FileNotFoundError):
                    claim.unlink()
            return
        _break_stale_claim(claim, root)
    yield None
