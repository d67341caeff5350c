"""The one allow-list of store paths backup copies and restore writes: the store's data
and the metadata it needs, by shape; control files of operations in flight never."""

from __future__ import annotations

import re

from tracklake._format.schema import KINDS

_NAME = r"[A-Za-z0-9._+@-]{1,128}"
_RUN = rf"project={_NAME}/run={_NAME}"
_STREAM = rf"(?:{'|'.join(KINDS)})/{_RUN}/rank=\d+/attempt=\d+"
_DATA = re.compile("|".join([
    rf"{_STREAM}/_?seg-\d{{6,}}-\d{{12,}}\.arrows",
    rf"{_STREAM}/part-\d{{12,}}-\d{{12,}}-\d{{6,}}\.parquet",
    rf"runs/{_RUN}/rank=\d+/attempt=\d+\.json",
    r"blobs/sha256/([0-9a-f]{2})/\1[0-9a-f]{62}",
    rf"pins/{_RUN}\.json",
]))
_EXPORT_STATE = re.compile(rf"exports/{_NAME}/{_RUN}\.json")
#: The store's policy file: restored only when asked, since it decides what retention deletes.
POLICY = "tracklake.toml"


def is_data_path(rel: str) -> bool:
    """True for a path holding the store's data or metadata (segments, parts, attempt
    files, blobs, pins): backup copies and restore writes these."""
    return _DATA.fullmatch(rel) is not None and ".." not in rel.split("/")


def is_export_state(rel: str) -> bool:
    """True for an exporter's cursor state (``exports/<name>/project=P/run=R.json``)."""
    return _EXPORT_STATE.fullmatch(rel) is not None and ".." not in rel.split("/")


def backed_up(rel: str) -> bool:
    """True for a store path a backup copies: data, exporter states and the policy."""
    return rel == POLICY or is_data_path(rel) or is_export_state(rel)
