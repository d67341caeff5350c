"""A real S3-compatible server on loopback for tests: `moto_server` (moto in server mode,
from PyPI) in a subprocess, reached through pyarrow's own S3 file system.

Tests get credentials and the endpoint the standard way (the AWS_* environment variables
that pyarrow and every AWS client read), never written into a store."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _env import child_env
from _optional import optional
from _reaper import reap_with_this_process

STARTUP_TIMEOUT = 60.0

#: the standard variables a client reads; moto accepts any key
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "tracklake-test",
    "AWS_SECRET_ACCESS_KEY": "tracklake-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # no look-ups of 169.254.169.254
}


@dataclass(frozen=True)
class S3Server:
    """A running moto server: its endpoint and a way to name a fresh bucket."""

    endpoint: str  # http://127.0.0.1:PORT
    process: subprocess.Popen[bytes]

    @property
    def environment(self) -> dict[str, str]:
        """The variables that point a client (pyarrow, boto3, a child process) at it."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_ENDPOINT_URL_S3": self.endpoint}

    def filesystem(self) -> object:
        """pyarrow's S3FileSystem pointed at this server."""
        fs = optional("pyarrow.fs")
        return fs.S3FileSystem(
            access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region=CREDENTIALS["AWS_DEFAULT_REGION"],
            endpoint_override=self.endpoint.removeprefix("http://"), scheme="http",
            allow_bucket_creation=True, allow_bucket_deletion=True)

    def new_bucket(self) -> str:
        """A fresh, empty bucket's name (each test gets its own)."""
        name = f"tl-{uuid.uuid4().hex[:16]}"
        self.filesystem().create_dir(name)  # type: ignore[attr-defined]
        return name


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_command(port: int) -> list[str]:
    executable = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    if executable is None:
        optional("moto.server")  # skipped (or failed under --require-extras) without moto
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    return [executable, "-H", "127.0.0.1", "-p", str(port)]


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A moto S3 server on 127.0.0.1, started once for the session and stopped after."""
    optional("moto")
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(_server_command(port), stdout=out, stderr=subprocess.STDOUT,
                                   env=child_env(), start_new_session=True)
    reap_with_this_process(process)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"moto_server exited with {process.returncode}:\n"
                                   + log.read_text(errors="replace")[-2000:])
            try:
                with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not answer within "
                                       f"{STARTUP_TIMEOUT} s") from None
                time.sleep(0.2)
        yield S3Server(endpoint, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The server, with the standard AWS_* variables pointing this process at it."""
    for name, value in s3_server.environment.items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture
def s3_bucket(s3_env: S3Server) -> str:
    """A fresh, empty bucket on the loopback server (the environment points at it)."""
    return s3_env.new_bucket()


