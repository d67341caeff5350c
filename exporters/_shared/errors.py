"""What every destination's error table shares: which file system errors waiting can fix."""

from __future__ import annotations

import errno

#: errnos that retrying cannot fix: a permission, a read-only file system, a name too long.
PERMANENT_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG})


def os_error_retryable(exc: OSError) -> bool:
    """Whether an OSError may go away by itself (a full disk, a lost mount, a time-out)."""
    return exc.errno not in PERMANENT_ERRNOS
