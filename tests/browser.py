"""A headless Chromium driven over the DevTools protocol (a pipe, no port, no network): open a page as a
person would, run script in it, collect what its console logs and the exceptions it throws, screenshot it."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium-headless-shell", "chromium", "google-chrome")


def executable() -> str | None:
    """The first headless-capable Chromium on PATH (Debian's chromium-headless-shell first), or None."""
    return next((found for name in CANDIDATES if (found := shutil.which(name))), None)


class Browser:
    """One headless Chromium with one page; messages on file descriptors 3 and 4, as --remote-debugging-pipe
    expects (JSON, each ended by a NUL byte)."""

    def __init__(self, exe: str, *, width: int = 1280, height: int = 900, log: Path | None = None):
        to_browser, from_us = os.pipe()
        to_us, from_browser = os.pipe()

        def wire() -> None:
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             "--disable-extensions", "--disable-background-networking", "--disable-sync", "about:blank"],
            preexec_fn=wire, pass_fds=(3, 4), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(log, "w") if log else subprocess.DEVNULL)
        os.close(to_browser)
        os.close(from_browser)
        self._write = os.fdopen(from_us, "wb", buffering=0)
        self._read = os.fdopen(to_us, "rb", buffering=0)
        self._pending = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable", page=True)
        self.call("Emulation.setDeviceMetricsOverride", page=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def _message(self) -> dict[str, Any]:
        while b"\0" not in self._pending:
            chunk = self._read.read(1 << 16)
            if not chunk:
                raise EOFError("the browser closed its pipe")
            self._pending += chunk
        message, self._pending = self._pending.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, *, page: bool = False, **params: Any) -> dict[str, Any]:
        """Send one command (to the page when `page`) and return its result; events met on the way are kept."""
        self._id += 1
        message = {"id": self._id, "method": method, "params": params, **({"sessionId": self.session} if page else {})}
        self._write.write(json.dumps(message).encode() + b"\0")
        while True:
            reply = self._message()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def open(self, url: str, *, timeout_s: float = 30.0) -> None:
        """Navigate and wait for the page's load event."""
        self.call("Page.navigate", page=True, url=url)
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load in {timeout_s} s")
            self.evaluate("1")  # a round trip, so that events arrive

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page; an exception in it raises."""
        result = self.call("Runtime.evaluate", page=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:60]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """What the page logged as an error or warning, and the exceptions it threw."""
        found = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(str(params["exceptionDetails"].get("exception", {}).get("description")
                                 or params["exceptionDetails"].get("text")))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                found.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
                found.append(params["entry"].get("text", ""))
        return found

    def screenshot(self, path: Path) -> Path:
        """The page as a person sees it, as a PNG."""
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", page=True, format="png")["data"]))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (EOFError, OSError, RuntimeError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def look_at(browser: Browser, page: Path, screenshot: Path) -> dict[str, Any]:
    """Open a report.html as a person would and say what they see: the errors the page logged, where the
    findings table stands, what the first screen shows (a screenshot), and how many sections are folded."""
    browser.events.clear()
    browser.open(page.resolve().as_uri())
    seen = browser.evaluate("""(() => {
        const findings = document.querySelector('section table');
        const box = findings ? findings.getBoundingClientRect() : null;
        return {findings_top: box && box.top, findings_bottom: box && box.bottom, height: innerHeight,
                findings_rows: findings ? findings.tBodies[0].rows.length : 0,
                first_screen: document.body.innerText.slice(0, 2000),
                folded: document.querySelectorAll('details.section:not([open])').length,
                broken_images: Array.from(document.images).filter(i => !i.complete || !i.naturalWidth).length};
    })()""")
    browser.screenshot(screenshot)
    seen["errors"] = browser.errors()
    return seen
