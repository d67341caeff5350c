"""Several hosts on one machine, for the tests of a store shared over a network file
system (docs/many-nodes.md).

- `FileServer`: an SFTP server (OpenSSH's sshd, on loopback, with keys made for it)
  exporting one directory, the store's home on the "file server".
- `FileServer.mount`: one node's mount of it (sshfs, in the foreground), with the kernel's
  attribute and directory-entry caches and sshfs's own caches on (`cache_seconds`), as
  NFS clients keep them; `Mount.hang()` stops the sshfs process, so that every access
  through that mount waits, and `Mount.resume()` lets it go on.
- `Node`: a host: Python code run in a UTS and mount namespace of its own (`unshare`)
  with its own host name and boot id (a file bind-mounted over the kernel's), and its own
  wall clock (`_node_clock`, an offset in seconds), reading and writing the store
  through its mount. Its processes cannot be probed from another node (another host name), as on a
  real cluster.

Needs root (namespaces, bind mounts), `sshfs` and `sshd` (Debian's `sshfs
openssh-server`); `missing()` says what is not here.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def missing() -> str | None:
    """Why the test bed cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (namespaces and bind mounts)"
    for tool in ("sshfs", "unshare", "fusermount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path(SSHD).exists():
        return "sshd is not installed (openssh-server)"
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Mount:
    """One node's mount of the export."""

    path: Path
    process: subprocess.Popen[bytes]

    def hang(self) -> None:
        """Every access through this mount waits from now on (its sshfs is stopped)."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def unmount(self) -> None:
        self.resume()
        subprocess.run(["fusermount", "-u", "-z", str(self.path)], check=False,
                       capture_output=True, timeout=30)
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


@dataclass
class FileServer:
    """sshd on loopback serving `export` over SFTP to the mounts it makes."""

    home: Path
    export: Path = field(init=False)
    mounts: list[Mount] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.export = self.home / "export"
        self.export.mkdir(parents=True)
        keys = self.home / "keys"
        keys.mkdir()
        for name in ("host", "user"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(keys / name)], check=True, timeout=60)
        self.port = _free_port()
        config = self.home / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {keys / 'host'}\n"
            f"AuthorizedKeysFile {keys / 'user.pub'}\nPasswordAuthentication no\n"
            "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
            "Subsystem sftp internal-sftp\nMaxSessions 50\nMaxStartups 50\n"
            f"PidFile {self.home / 'sshd.pid'}\n")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        with (self.home / "sshd.log").open("wb") as log:
            self._sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)],
                                          stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self._sshd.poll() is not None:
                    raise RuntimeError("sshd did not start: "
                                       + (self.home / "sshd.log").read_text()) from None
                time.sleep(0.1)
        self._key = keys / "user"

    def mount(self, name: str, *, cache_seconds: float = 2.0) -> Mount:
        """A mount of the export at ``home/<name>``, caching attributes, entries and
        directory listings for `cache_seconds` (0: no caches)."""
        path = self.home / name
        path.mkdir()
        caching = (f"cache=yes,cache_timeout={int(cache_seconds)},"
                   f"attr_timeout={cache_seconds},entry_timeout={cache_seconds},"
                   f"negative_timeout={cache_seconds},dir_cache=yes"
                   if cache_seconds else "cache=no,attr_timeout=0,entry_timeout=0,"
                                         "negative_timeout=0,dir_cache=no")
        process = subprocess.Popen(
            ["sshfs", "-f", "-p", str(self.port), "-o",
             f"IdentityFile={self._key},StrictHostKeyChecking=no,"
             f"UserKnownHostsFile=/dev/null,LogLevel=ERROR,{caching}",
             f"root@127.0.0.1:{self.export}", str(path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        mount = Mount(path, process)
        self.mounts.append(mount)
        deadline = time.monotonic() + 30
        while not os.path.ismount(path):
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"sshfs did not mount {path}")
            time.sleep(0.1)
        return mount

    def close(self) -> None:
        for mount in self.mounts:
            mount.unmount()
        self._sshd.terminate()
        self._sshd.wait(timeout=10)


@dataclass
class Node:
    """A host that reaches the store through `mount`, with its own name, boot id and
    clock (`clock` seconds from the real one)."""

    name: str
    mount: Mount
    clock: float = 0.0
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def __post_init__(self) -> None:
        self._boot_file = self.mount.path.parent / f"boot_id-{self.name}"
        self._boot_file.write_text(self.boot_id + "\n")

    @property
    def root(self) -> Path:
        return self.mount.path / "store"

    def popen(self, code: str, *, env_extra: dict[str, str] | None = None,
              stdin: int | None = None) -> subprocess.Popen[str]:
        """Run Python `code` on this node; ``TRACKLAKE_ROOT`` is the store through its
        mount, and ``NODE`` its name."""
        shell = (f"hostname {self.name} && mount --bind {self._boot_file} {BOOT_ID} && "
                 f'exec "$0" -c "$1"')
        env = {**os.environ, "TRACKLAKE_ROOT": str(self.root), "NODE": self.name,
               "NODE_CLOCK": str(self.clock),
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                              os.environ.get("PYTHONPATH", "")]),
               **(env_extra or {})}
        return subprocess.Popen(["unshare", "--uts", "--mount", "sh", "-c", shell,
                                 sys.executable, f"import _node_clock\n{code}"], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=stdin)

    def run(self, code: str, timeout: float = 120, *,
            env_extra: dict[str, str] | None = None) -> str:
        """Run Python `code` on this node to its end; its stdout (raises if it failed)."""
        process = self.popen(code, env_extra=env_extra)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            raise AssertionError(f"{self.name}: did not end in {timeout} s\n{err}") from None
        if process.returncode:
            raise AssertionError(f"{self.name}: exit {process.returncode}\n{err}")
        return out
