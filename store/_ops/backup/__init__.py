"""Backup and restore of a store to and from a directory or an object store: incremental
by content checksum, verified, resumable, selective, and recorded in the store for
retention (docs/lifecycle.md)."""

from tracklake._ops.backup.backup import KILL_AT_ENV, BackupReport, DamagedSourceError, backup
from tracklake._ops.backup.errors import BackupError
from tracklake._ops.backup.follow import follow
from tracklake._ops.backup.ledger import LEDGER_DIR, backups, unbacked_files
from tracklake._ops.backup.manifest import MANIFEST, read_manifest
from tracklake._ops.backup.restore import restore, verify_backup
from tracklake._ops.backup.select import Selection
from tracklake._ops.backup.target import local_digest, open_target

__all__ = [
    "KILL_AT_ENV",
    "LEDGER_DIR",
    "MANIFEST",
    "BackupError",
    "BackupReport",
    "DamagedSourceError",
    "Selection",
    "backup",
    "backups",
    "follow",
    "local_digest",
    "open_target",
    "read_manifest",
    "restore",
    "unbacked_files",
    "verify_backup",
]
