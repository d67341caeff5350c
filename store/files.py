"""Durable file writes, for tools that keep their own files beside or outside the store
(an exporter's cursors, a destination's event files): a file replaced atomically, and
fsync of a file's contents and of a directory's entries; and a file of the store read
as untrusted input (a regular file only, never a link, FIFO or device, and bounded)."""

from tracklake._format.files import (
    NotRegularFileError,
    fsync_dir,
    fsync_file,
    open_regular,
    read_regular,
    write_atomic,
)

__all__ = ["NotRegularFileError", "fsync_dir", "fsync_file", "open_regular", "read_regular",
           "write_atomic"]
