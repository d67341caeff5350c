"""Durable file writes, for tools that keep their own files beside or outside the store
(an exporter's cursors, a destination's event files): a file replaced atomically, and
fsync of a file's contents and of a directory's entries."""

from tracklake._format.files import fsync_dir, fsync_file, write_atomic

__all__ = ["fsync_dir", "fsync_file", "write_atomic"]
