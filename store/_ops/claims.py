"""A stream's `.compacting` claim: one compactor at a time, and a claim left by a killed
compactor known stale (its host, boot id, pid and process start time; from another host,
its age), with the temporaries such a compactor leaves removed."""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import platform
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: A claim from another host (or unreadable) that was not refreshed for this long was left
#: by a compactor that died; on its own host a claim is checked exactly (pid, start time,
#: boot id).
CLAIM_STALE_SECONDS = 600.0


def _boot_id() -> str | None:
    """This machine's boot id (Linux), to tell a claim made before a reboot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, Linux); None if unknown, gone,
    or a zombie (killed, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) <= 19 or fields[0] in ("Z", "X") or not fields[19].isdigit():
        return None
    return int(fields[19])


def _claim_record() -> dict[str, object]:
    pid = os.getpid()
    return {"pid": pid, "host": platform.node(), "boot_id": _boot_id(),
            "start_ticks": _start_ticks(pid),
            "claimed_at": _dt.datetime.now(_dt.timezone.utc).isoformat()}


def _read_claim(path: Path) -> dict[str, Any] | None:
    """The claim's record if it is one this version writes, else None (empty, foreign)."""
    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    types: dict[str, type | tuple[type, ...]] = {
        "pid": int, "host": str, "boot_id": (str, type(None)),
        "start_ticks": (int, type(None))}
    if any(not isinstance(record.get(k), t) for k, t in types.items()):
        return None
    return record


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (owned by anyone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def claim_is_stale(record: dict[str, Any] | None, age: float) -> bool:
    """True if the compactor that made this claim is certainly gone.

    On the claim's own host this is exact: the machine rebooted since (boot id), or no
    process with its pid and start time runs. A claim from another host (a shared file
    system) or one that cannot be read is stale once its age (the claimant refreshes it
    after each part) passes CLAIM_STALE_SECONDS.
    """
    if record is None or record["host"] != platform.node():
        return age > CLAIM_STALE_SECONDS
    boot = _boot_id()
    if record["boot_id"] is not None and boot is not None and record["boot_id"] != boot:
        return True
    if not process_alive(record["pid"]):
        return True
    started: int | None = record["start_ticks"]
    if started is None:
        return False  # no start time recorded: a live pid is taken to be the claimant
    return _start_ticks(record["pid"]) != started  # pid reused, or the claimant a zombie


def _take_claim(claim: Path) -> bool:
    """Create the claim exclusively, whole (written aside, then hard-linked into place:
    `link` fails if the name exists, on NFS and Lustre too, where locks may not work)."""
    data = json.dumps(_claim_record()).encode()
    tmp = claim.with_name(f"{claim.name}.{platform.node()}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)  # a full disk raises here, leaving nothing behind
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


def _break_stale_claim(claim: Path) -> None:
    """Remove a claim judged stale, unless another compactor replaced it meanwhile."""
    try:
        before = claim.read_bytes()
        st = claim.stat()
    except FileNotFoundError:
        return
    if not claim_is_stale(_read_claim(claim), time.time() - st.st_mtime):
        return
    aside = claim.with_name(f"{claim.name}-stale.{platform.node()}.{os.getpid()}.tmp")
    try:
        os.rename(claim, aside)
    except FileNotFoundError:
        return  # another compactor broke it first
    if aside.read_bytes() != before or aside.stat().st_ino != st.st_ino:
        # a live claim made after our look: put it back (fails only if yet another exists)
        with contextlib.suppress(FileExistsError):
            os.link(aside, claim)
    aside.unlink()


#: Temporaries of a claim, of a compactor's sorted runs (a directory), and of a part
#: (`.part-...-NNNNNN.parquet.PID.tmp`).
_CLAIM_TMP = re.compile(r"^\.compacting(?:-stale)?\.(.+)\.(\d+)\.tmp$")
_SORT_TMP = re.compile(r"^\.sort\.(.+)\.(\d+)\.tmp$")
_PART_TMP = re.compile(r"^\.part-.*\.parquet\.(\d+)\.tmp$")


def _remove_leftovers(directory: Path) -> None:
    """Delete temporaries left by a process killed on this host (their pid is gone): a
    claim's, a compactor's sorted runs, or a part's older than CLAIM_STALE_SECONDS (unpack
    writes parts without a claim, maybe from another host sharing the file system)."""
    host = platform.node()
    for name in os.listdir(directory):
        if (m := _SORT_TMP.match(name)) is not None:
            if m.group(1) == host and not process_alive(int(m.group(2))):
                shutil.rmtree(directory / name, ignore_errors=True)
            continue
        if (m := _CLAIM_TMP.match(name)) is not None:
            gone = m.group(1) == host and not process_alive(int(m.group(2)))
        elif (m := _PART_TMP.match(name)) is not None:
            try:
                age = time.time() - (directory / name).stat().st_mtime
            except FileNotFoundError:
                continue
            gone = age > CLAIM_STALE_SECONDS and not process_alive(int(m.group(1)))
        else:
            continue
        if gone:
            with contextlib.suppress(FileNotFoundError):
                (directory / name).unlink()


@contextlib.contextmanager
def hold_claim(directory: Path) -> Iterator[Path | None]:
    """Exclusively claim the stream in `directory` for one compactor; yields the claim
    (None if another live compactor holds it). A claim left by one that died is broken."""
    claim = directory / ".compacting"
    for _ in range(3):
        if _take_claim(claim):
            try:
                _remove_leftovers(directory)
                yield claim
            finally:
                with contextlib.suppress(FileNotFoundError):
                    claim.unlink()
            return
        _break_stale_claim(claim)
    yield None
