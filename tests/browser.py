"""A real browser for tests: headless Chromium (Debian's ``chromium``), driven over the DevTools protocol.

    with Chromium(tmp_path) as browser:
        browser.open("file:///.../report.html")
        browser.evaluate("document.images.length")

Started in the fixture that needs it and stopped by its pid; where there is no chromium the fixture skips
with the reason (.ci/run installs it, so CI always runs these tests). The protocol is spoken with
websocket-client: one page, ``Page.navigate`` and ``Runtime.evaluate``, nothing more.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def find() -> str | None:
    return next((p for p in (shutil.which(c) for c in CANDIDATES) if p), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Chromium:
    def __init__(self, workdir: Path, timeout: float = 60.0):
        self.exe = find()
        self.workdir, self.timeout = Path(workdir), timeout
        self.proc = None
        self._ids = itertools.count(1)

    def __enter__(self) -> "Chromium":
        import websocket

        port = _free_port()
        profile = self.workdir / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        # The flags a sandboxed, offline machine needs: no sandbox (root), no GPU, no calls home.
        cmd = [self.exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-quic",
               "--allow-file-access-from-files", f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
               "--remote-debugging-address=127.0.0.1", "--window-size=1280,2000", "about:blank"]
        self.log = open(self.workdir / "chromium.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + self.timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=2) as r:
                    pages = [t for t in json.load(r) if t.get("type") == "page"]
                if pages:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.__exit__()
                raise RuntimeError(f"chromium did not start: see {self.workdir / 'chromium.log'}")
            time.sleep(0.2)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=self.timeout,
                                              suppress_origin=True)
        # A headless window never has the OS focus; apps that track the focused widget (JupyterLab's "current
        # notebook", which its commands act on) need the page to believe it has it.
        self.send("Emulation.setFocusEmulationEnabled", enabled=True)
        return self

    def send(self, method: str, **params) -> dict:
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def evaluate(self, expression: str, await_promise: bool = True):
        result = self.send("Runtime.evaluate", expression=expression, awaitPromise=await_promise, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails'].get('text')} "
                               f"{result['exceptionDetails'].get('exception', {}).get('description', '')}")
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def wait_for(self, condition: str, timeout: float | None = None) -> None:
        deadline = time.time() + (timeout or self.timeout)
        while not self.evaluate(f"Boolean({condition})"):
            if time.time() > deadline:
                raise TimeoutError(f"the page never satisfied: {condition}")
            time.sleep(0.25)

    def __exit__(self, *exc) -> None:
        try:
            if getattr(self, "ws", None) is not None:
                self.ws.close()
        finally:
            if self.proc is not None and self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)  # chromium's helper processes too
                self.proc.wait()
            if getattr(self, "log", None):
                self.log.close()
