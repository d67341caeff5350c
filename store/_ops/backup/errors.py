"""The error every backup and restore failure raises, in a module of its own so that the
copy routines and the destinations can both name it."""

from __future__ import annotations

from tracklake._errors import StoreError


class BackupError(StoreError):
    """A backup or restore cannot go ahead: damage, a conflict, or no backup there."""
