"""Fixtures of the exporter tests: a real MLflow tracking server on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from _env import child_env
from _reaper import reap_with_this_process

# Before anything imports mlflow: `import mlflow` creates its telemetry client unless
# this is set, and that client would send usage data once something is logged.
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"

#: A server that exits is seen at once; one that is slow to answer is waited for this
#: long: the first processes to import mlflow after an install write its bytecode, and
#: under a loaded machine a server took over 60 s to answer its first /health.
STARTUP_TIMEOUT = 180.0
STOP_TIMEOUT = 15.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class MlflowServer:
    """An `mlflow server` subprocess (sqlite backend, proxied artifacts) on a fixed
    loopback port, which tests can stop and start again to simulate an outage."""

    def __init__(self, directory: Path, port: int) -> None:
        self.directory = directory
        self.port = port
        self.uri = f"http://127.0.0.1:{port}"
        self.database = directory / "mlflow.db"
        self.log = directory / "server.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the server and wait until ``GET /health`` answers."""
        if self.running:
            return
        env = child_env() | {
            "MLFLOW_DISABLE_TELEMETRY": "true",  # the server has its own telemetry client
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",  # no job runner processes
        }
        command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
                   "--port", str(self.port), "--workers", "1",
                   "--backend-store-uri", f"sqlite:///{self.database}",
                   "--artifacts-destination", str(self.directory / "artifacts")]
        with open(self.log, "ab") as log:
            # a session of its own, so that stop() reaches uvicorn's worker process too
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=env,
                                             cwd=self.directory, start_new_session=True)
        reap_with_this_process(self._process)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self._process.returncode}:\n"
                                   + self._log_tail())
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer /health within {STARTUP_TIMEOUT} s:\n"
                           + self._log_tail())

    def stop(self) -> None:
        """Stop the server (its whole process group) and wait until the port is free."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(STOP_TIMEOUT)
        deadline = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < deadline and self._listening():
            time.sleep(0.1)  # uvicorn's worker may outlive its parent for a moment

    def _listening(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """The server is down inside the block and up again (same port, same data) after."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return "(no log)"


@pytest.fixture(scope="session")
def _mlflow_server_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"), _free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mlflow_server(_mlflow_server_process: MlflowServer) -> str:
    """The tracking URI of a real `mlflow server` on loopback, shared by the session."""
    return _mlflow_server_process.uri


@pytest.fixture
def mlflow_server_control(_mlflow_server_process: MlflowServer) -> Iterator[MlflowServer]:
    """The server behind `mlflow_server`, to stop and restart (``with server.outage():``);
    it is running again after the test whatever the test did."""
    yield _mlflow_server_process
    _mlflow_server_process.start()
