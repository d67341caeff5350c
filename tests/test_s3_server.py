"""The loopback S3 server that object-store tests use answers like S3, through pyarrow."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from _s3 import S3Server


def test_pyarrow_writes_and_reads_parquet_on_the_loopback_server(s3_bucket: str,
                                                                  s3_env: S3Server) -> None:
    from pyarrow import fs

    table = pa.table({"step": [1, 2, 3], "value": [0.5, 0.25, 0.125]})
    # the endpoint and credentials come from the standard environment, as users set them
    s3, path = fs.FileSystem.from_uri(f"s3://{s3_bucket}/store/part.parquet")
    pq.write_table(table, path, filesystem=s3)
    assert pq.read_table(path, filesystem=s3).equals(table)
    listed = s3.get_file_info(fs.FileSelector(f"{s3_bucket}/store"))
    assert [info.base_name for info in listed] == ["part.parquet"]


def test_each_test_gets_an_empty_bucket(s3_bucket: str, s3_env: S3Server) -> None:
    from pyarrow import fs

    s3 = s3_env.filesystem()
    assert isinstance(s3, fs.S3FileSystem)
    assert s3.get_file_info(fs.FileSelector(s3_bucket, recursive=True)) == []
