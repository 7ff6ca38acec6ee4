"""A real headless Chromium, driven over the Chrome DevTools Protocol.

    with Chromium(tmp_path) as browser:
        page = browser.page()
        page.navigate("http://127.0.0.1:8000/dashboard")
        page.evaluate("document.title")
        page.screenshot(path)

Debian's ``chromium`` is started with ``--remote-debugging-port`` on a free
loopback port and a fresh profile; the page is spoken to over the
``websockets`` client. Every console error, uncaught exception and request
the page makes is recorded, so a test can say none went wrong or elsewhere.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from websockets.sync.client import ClientConnection, connect

from tests.servers import free_port

CHROMIUM = os.environ.get("FERRY_CHROMIUM", "/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars")
START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 30.0


def chromium_available() -> bool:
    return shutil.which(CHROMIUM) is not None


class BrowserError(RuntimeError):
    pass


class Chromium:
    def __init__(self, workdir: Path, width: int = 1440, height: int = 1200) -> None:
        self._workdir = workdir
        self._size = (width, height)
        self._port = free_port()
        self._log = open(workdir / "chromium.log", "wb")
        self._process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={workdir / 'profile'}", f"--remote-debugging-port={self._port}",
             "--remote-debugging-address=127.0.0.1", f"--window-size={width},{height}", "about:blank"],
            stdout=self._log, stderr=subprocess.STDOUT)
        self._connections = contextlib.ExitStack()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def page(self) -> Page:
        """The tab Chromium opened at start, with its events switched on."""
        targets = self._targets()
        url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
        # Entered as a context manager, the way websockets wants its sync connections used.
        page = Page(self._connections.enter_context(connect(url, max_size=None, open_timeout=START_TIMEOUT_S)))
        for domain in ("Runtime", "Log", "Network", "Page"):
            page.call(f"{domain}.enable")
        width, height = self._size
        page.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        return page

    def close(self) -> None:
        self._connections.close()
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()

    def log_text(self) -> str:
        return (self._workdir / "chromium.log").read_text(errors="replace")

    def _targets(self) -> list[dict[str, Any]]:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BrowserError(f"chromium exited with {self._process.returncode}:\n{self.log_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self._port}/json/list", timeout=2) as response:
                    targets = json.loads(response.read())
                if any(t.get("type") == "page" for t in targets):
                    return targets
            except OSError:
                pass
            time.sleep(0.1)
        raise BrowserError(f"chromium's DevTools did not answer within {START_TIMEOUT_S} s")


class Page:
    def __init__(self, socket: ClientConnection) -> None:
        self._socket = socket
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        self._socket.send(json.dumps({"id": call_id, "method": method, "params": params}))
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while True:
            message = json.loads(self._socket.recv(timeout=max(0.01, deadline - time.monotonic())))
            if message.get("id") == call_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self.events.append(message)

    def navigate(self, url: str) -> None:
        """Open ``url`` and return once its load event fired."""
        seen = len(self.events)
        result = self.call("Page.navigate", url=url)
        if result.get("errorText"):
            raise BrowserError(f"navigating to {url}: {result['errorText']}")
        self._wait_event("Page.loadEventFired", seen)

    def _wait_event(self, method: str, since: int) -> None:
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while not any(event.get("method") == method for event in self.events[since:]):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrowserError(f"no {method} within {CALL_TIMEOUT_S} s")
            self.events.append(json.loads(self._socket.recv(timeout=remaining)))

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited if it is a promise)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float, what: str) -> Any:
        """Poll ``expression`` until it is truthy; return its value."""
        deadline = time.monotonic() + timeout_s
        value = None
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last value {value!r}; "
                             f"page errors {self.errors()}")

    def screenshot(self, path: Path) -> bytes:
        png = base64.b64decode(self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        return png

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries seen so far."""
        out = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(f"exception: {params['exceptionDetails']}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        return out

    def requested_urls(self) -> list[str]:
        return [event["params"]["request"]["url"] for event in self.events
                if event.get("method") == "Network.requestWillBeSent"]
