"""A headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``):
no Python package, no port, no WebDriver. For tests that must see a page as a reader does.

    with Chromium.start() as browser:
        page = browser.open("file:///.../report.html", ready="document.querySelector('#x')")
        page.text, page.images, page.errors, page.screenshot(path)

The browser is Debian's ``chromium-headless-shell`` (or ``chromium``; ``SCALESTUDY_CHROMIUM``
names another binary). ``find_binary()`` returns None when none is installed.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CANDIDATES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome",
              "headless_shell")
FLAGS = ["--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
         "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
         "--disable-extensions", "--disable-background-networking", "--disable-sync",
         "--mute-audio", "--hide-scrollbars", "--allow-file-access-from-files"]


def find_binary() -> str | None:
    env = os.environ.get("SCALESTUDY_CHROMIUM")
    if env:
        return shutil.which(env) or (env if os.access(env, os.X_OK) else None)
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class CDPError(RuntimeError):
    pass


class Chromium:
    """One browser process; its DevTools messages are NUL-separated JSON on fds 3 (in) / 4 (out)."""

    def __init__(self, binary: str, width: int = 1400, height: int = 1000):
        self.profile = tempfile.mkdtemp(prefix="scalestudy-chromium-")
        to_r, self._to_w = os.pipe()     # we write commands, the browser reads fd 3
        self._from_r, from_w = os.pipe()  # the browser writes fd 4, we read
        argv = [binary, *FLAGS, f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}", "about:blank"]
        # a small exec wrapper moves the pipe ends to the fds the browser expects
        move = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
                "os.execvp(sys.argv[3], sys.argv[3:])")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", move, str(to_r), str(from_w), *argv],
            pass_fds=(to_r, from_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, start_new_session=True)
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    @classmethod
    def start(cls, binary: str | None = None, **kw) -> "Chromium":
        binary = binary or find_binary()
        if binary is None:
            raise FileNotFoundError("no Chromium: apt-get install chromium-headless-shell")
        return cls(binary, **kw)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- the protocol ------------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from Chromium")
            ready, _, _ = select.select([self._from_r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._from_r, 1 << 20)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.stderr else ""
                raise CDPError(f"Chromium closed the pipe: {err}")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict:
        self._id += 1
        mid = self._id
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read_message(deadline)
            if m.get("id") == mid:
                if "error" in m:
                    raise CDPError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str, session: str | None = None, timeout: float = 60.0) -> dict:
        for i, m in enumerate(self.events):
            if m.get("method") == method and (session is None or m.get("sessionId") == session):
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            m = self._read_message(deadline)
            if m.get("method") == method and (session is None or m.get("sessionId") == session):
                return m
            self.events.append(m)

    def drain(self, seconds: float = 0.2) -> None:
        """Collect the events that arrive within ``seconds``."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._read_message(deadline))
        except TimeoutError:
            pass

    # --- pages -------------------------------------------------------------------------------

    def open(self, url: str, ready: str | None = None, timeout: float = 60.0) -> "Page":
        """Load ``url`` in a new tab; wait for its load event, then until the JavaScript
        expression ``ready`` is truthy, then until every image has loaded or failed."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.send(f"{domain}.enable", session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_event("Page.loadEventFired", session, timeout)
        page = Page(self, session)
        deadline = time.monotonic() + timeout
        while ready and not page.evaluate(ready):
            if time.monotonic() > deadline:
                raise TimeoutError(f"page never satisfied {ready!r}")
            time.sleep(0.1)
        page.evaluate("Promise.all(Array.from(document.images).map(i => i.complete ? 0 :"
                      " new Promise(r => { i.onload = i.onerror = r; })))", await_promise=True)
        self.drain()
        return page

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.send("Browser.close", timeout=5)
        except (CDPError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        for fd in (self._to_w, self._from_r):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.stderr:
            self.proc.stderr.close()
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    def __init__(self, browser: Chromium, session: str):
        self.browser, self.session = browser, session

    def evaluate(self, expression: str, await_promise: bool = False):
        r = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                   "awaitPromise": await_promise},
                              session=self.session)
        if "exceptionDetails" in r:
            raise CDPError(f"{expression!r}: {r['exceptionDetails']}")
        return r.get("result", {}).get("value")

    @property
    def text(self) -> str:
        """What a reader sees: the rendered text (hidden elements excluded)."""
        return self.evaluate("document.body.innerText")

    @property
    def images(self) -> list[dict]:
        """Every <img>: whether it loaded (complete, natural width > 0) and is on screen."""
        return self.evaluate(
            "Array.from(document.images).map(i => { const r = i.getBoundingClientRect();"
            " return {src: i.src.slice(0, 40), alt: i.alt, complete: i.complete,"
            " naturalWidth: i.naturalWidth, width: r.width, height: r.height}; })")

    @property
    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and the browser's error log entries so far."""
        self.browser.drain(0.1)
        out = []
        for m in self.browser.events:
            if m.get("sessionId") != self.session:
                continue
            p = m.get("params", {})
            if m.get("method") == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
            elif m.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console.error: " + " ".join(str(a.get("value", a.get("description")))
                                                         for a in p.get("args", [])))
            elif m.get("method") == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                e = p["entry"]
                out.append(f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}".strip())
        return [e[:300] for e in out]

    def screenshot(self, path: str | os.PathLike, full_page: bool = True) -> Path:
        """A PNG of the page; ``full_page``: the window grown to the height of the tallest
        scrolling content first (pages that scroll inside an element, not the document)."""
        if full_page:
            height = self.evaluate(
                "Math.max(document.documentElement.scrollHeight, ...Array.from("
                "document.querySelectorAll('*')).map(e => e.scrollHeight))")
            width = self.evaluate("window.innerWidth")
            self.browser.send("Emulation.setDeviceMetricsOverride",
                              {"width": int(width), "height": int(min(height, 16000)),
                               "deviceScaleFactor": 1, "mobile": False}, session=self.session)
            time.sleep(0.3)  # a relayout at the new size
        data = self.browser.send("Page.captureScreenshot", {"format": "png"},
                                 session=self.session)["data"]
        if full_page:
            self.browser.send("Emulation.clearDeviceMetricsOverride", session=self.session)
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path
