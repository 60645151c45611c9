"""Headless Chromium for tests: Debian's `chromium` (which .ci/run installs), found or skipped (a failure under
CI=true), and driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON messages ending in
NUL on file descriptors 3 and 4), so a test can load a page, type into it and read it back with no driver
package."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is missing under CI (.ci/run installs Debian's chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


class Browser:
    """One headless Chromium with one page. `with Browser(profile_dir) as page: page.open(url)`."""

    def __init__(self, profile_dir: Path, width: int = 1280, height: int = 900):
        to_chrome, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome = os.pipe()

        def as_fds_3_and_4():  # in the child, before exec: the two pipe ends Chromium expects
            read, write = os.dup(to_chrome), os.dup(from_chrome)
            os.dup2(read, 3)
            os.dup2(write, 4)

        self.process = subprocess.Popen(
            [chromium(), "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={profile_dir}",
             "--remote-debugging-pipe", "--no-first-run", f"--window-size={width},{height}"],
            preexec_fn=as_fds_3_and_4, pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome)
        os.close(from_chrome)
        self._buffer, self._next_id, self.events = b"", 0, []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.process.kill()
        self.process.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)

    def call(self, method: str, session: bool = False, timeout: float = 60, **params) -> dict:
        """Send one DevTools command (to the page when `session`) and return its result."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def open(self, url: str) -> None:
        """Load `url` and wait for its load event."""
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> None:
        """Poll until `expression` is true in the page."""
        deadline = time.monotonic() + timeout
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout} s: {expression}")
            time.sleep(0.1)

    def type(self, text: str) -> None:
        """Type `text` into the focused element, one key at a time (keydown, input, keyup)."""
        for char in text:
            self.call("Input.dispatchKeyEvent", session=True, type="keyDown", text=char, key=char)
            self.call("Input.dispatchKeyEvent", session=True, type="keyUp", key=char)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", session=True, format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path
