"""Exceptions raised by tracklake.

    TracklakeError                 root of every error tracklake raises on purpose
    ├── RunStateError              the run is finished (or not started); logging is refused
    ├── InvalidNameError           a project/run/artifact name is unusable
    ├── StoreError                 the store on disk cannot be used as asked
    │   ├── RunNotFoundError       no run matches the id given
    │   ├── FormatError            a file is damaged or not a tracklake file
    │   │   └── NewerFormatError   a file was written by a newer, incompatible tracklake
    │   ├── QueryError             a SQL query failed or tried to change the store
    │   ├── NoAnswerError          a file or directory of the store gave no answer in time
    │   └── PackConflictError      a pack holds records that differ from the target's
    ├── CursorError                a serialised cursor is malformed
    ├── ExportError                a destination refused or failed; says if retrying can help
    └── WandbError                 `tracklake.wandb` refuses a call as W&B refuses it
        ├── WandbUsageError        W&B's UsageError: e.g. logging to a finished run
        ├── WandbCommError         W&B's CommError (never raised: nothing is online)
        └── WandbConfigError       W&B's ConfigError: changing a config value without
                                   allow_val_change

Value errors in what a caller logs raise the builtin `TypeError` or `ValueError`, naming
the key, because they are misuse of the API rather than trouble with the store.
"""

from __future__ import annotations


class TracklakeError(Exception):
    """Root of every error tracklake raises on purpose."""


class RunStateError(TracklakeError):
    """The run is not in a state that allows this call (e.g. logging after finish())."""


class InvalidNameError(TracklakeError, ValueError):
    """A project, run or artifact name cannot be used safely as a path component."""


class StoreError(TracklakeError):
    """The store on disk cannot be used as asked."""


class RunNotFoundError(StoreError, LookupError):
    """No run in the store matches the given id."""


class FormatError(StoreError):
    """A file in the store is damaged or is not a tracklake file."""


class NewerFormatError(FormatError):
    """A file was written by a newer major format version than this tracklake reads."""


class QueryError(StoreError):
    """A SQL query failed, or tried to write to the store or the file system."""


class NoAnswerError(StoreError):
    """A file or directory of the store gave no answer within the read timeout (a hung
    network mount, a stuck file system); `path` names it, `seconds` the timeout."""

    def __init__(self, path: object, seconds: float) -> None:
        super().__init__(f"could not read {path}: no answer within {seconds:g} s (a hung "
                         "mount or a stuck file system?); TRACKLAKE_READ_TIMEOUT sets how "
                         "long a read may wait")
        self.path = str(path)
        self.seconds = seconds


class PackConflictError(StoreError):
    """A pack holds records or an attempt that differ from what the target store has."""


class CursorError(TracklakeError, ValueError):
    """A serialised cursor cannot be parsed."""


class ExportError(TracklakeError):
    """A destination refused or failed to take records.

    `retryable` says whether trying again later can help (a server that is down, a
    timeout) or not (bad credentials, a destination that rejects the data).
    """

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class WandbError(TracklakeError):
    """`tracklake.wandb` refuses a call as W&B refuses it (``wandb.Error``)."""


class WandbUsageError(WandbError):
    """W&B's ``UsageError``: e.g. a call on a finished run."""


class WandbConfigError(WandbError):
    """W&B's ``ConfigError``: a config value changed without ``allow_val_change``."""


class WandbCommError(WandbError):
    """W&B's ``CommError``: never raised, since nothing talks to a network."""
