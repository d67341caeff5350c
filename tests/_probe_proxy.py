"""An HTTP proxy on loopback that records every request line and answers 502: to see
where a library tries to connect, without any network."""

from __future__ import annotations

import socket
import threading


class ProbeProxy:
    """A proxy on loopback that records each request line and answers 502: W&B behind a
    proxy, with the service unreachable beyond it."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                self.requests.append(conn.recv(65536).split(b"\r\n", 1)[0])
                conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")

    def close(self) -> None:
        self._server.close()
