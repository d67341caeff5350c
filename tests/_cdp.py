"""Headless Chromium (the system's) driven through its DevTools protocol, over the
`websockets` client: enough of CDP for the dashboard's tests (evaluate, mouse, network log).
Every wait polls with a generous deadline; nothing asserts how long anything took."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _optional import optional
from _programs import program

#: No host name or address resolves but the dashboard's (127.0.0.1), and none of
#: Chromium's own background traffic runs.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
         "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-default-apps",
         "--disable-domain-reliability", "--window-size=1400,1000",
         "--remote-debugging-port=0", "--remote-allow-origins=*"]

WAIT = 60.0


class Browser:
    """One Chromium with one page; `events` holds every CDP event seen."""

    def __init__(self, profile: Path) -> None:
        sync_client = optional("websockets.sync.client")
        self.process = subprocess.Popen(
            [program("chromium"), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._stack = contextlib.ExitStack()
        self._stack.callback(self._end)
        with self._stack:  # Chromium is stopped if it cannot be reached
            port_file = profile / "DevToolsActivePort"
            port = until(lambda: port_file.exists() and port_file.read_text().split("\n")[0],
                         "Chromium's DevTools port")
            pages = until(lambda: [t for t in _json(f"http://127.0.0.1:{port}/json/list")
                                   if t["type"] == "page"], "a page target")
            self.ws = self._stack.enter_context(sync_client.connect(
                pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=WAIT))
            self._stack = self._stack.pop_all()
        self.events: list[dict[str, Any]] = []
        self._id = 0
        self.call("Network.enable")
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=WAIT))
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def js(self, expression: str) -> Any:
        """The value of `expression` in the page (awaited if a promise)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression: str, what: str) -> Any:
        return until(lambda: self.js(expression), what)

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def mouse(self, kind: str, x: float, y: float, **extra: Any) -> None:
        self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, **extra)

    def click(self, x: float, y: float, count: int = 1) -> None:
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y, button="left", clickCount=count)
        self.mouse("mouseReleased", x, y, button="left", clickCount=count)

    def click_element(self, selector: str) -> None:
        box = self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                      "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
                      "return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        self.click(*box)

    def requested(self) -> list[str]:
        """Every URL the page asked for (drains pending events first)."""
        self.js("1")
        return [e["params"]["request"]["url"] for e in self.events
                if e.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        self._stack.close()

    def _end(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=WAIT) as answer:
        return json.load(answer)


def until(probe: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Poll `probe` until it returns something true; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except OSError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)
