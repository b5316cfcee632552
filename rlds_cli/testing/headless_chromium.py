"""A headless Chromium driven over the DevTools protocol on a pipe, for tests of ``rlds show`` pages.

No driver process, no port, no browser download (Debian's ``chromium``). Chromium runs with
``--remote-debugging-pipe``: it reads commands (JSON, each ended by a NUL byte) on fd 3 and writes
replies and events on fd 4; one reader thread sorts replies by id and events by tab. Guarantees:

* **nothing waits unbounded**: every command and every :meth:`Tab.wait_for` has a timeout and
  raises :class:`ChromiumError` naming what it waited for; a browser that died or closed its pipe
  fails the waits at once;
* **nothing is left behind**: Chromium runs in its own process group with a fresh profile folder;
  :meth:`Chromium.close` (also at ``with`` exit) asks it to close, then SIGKILLs the group and
  removes the profile;
* **errors are collected**: each tab's :attr:`Tab.errors` gathers console errors and warnings,
  uncaught exceptions, error log entries and any request for other than ``file:`` or ``data:``
  URLs;
* **no real-time priority**: Chromium starts under SCHED_OTHER without the right to raise it,
  whatever its caller's policy (:func:`_no_priority_raise`).

Imports no pytest.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["Chromium", "ChromiumError", "Tab", "group_members"]

#: Flags for a small machine: no sandbox helpers, no zygote, no GPU process work, no first-run UI.
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--no-zygote",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--mute-audio",
)

#: Keys :meth:`Tab.press` knows: name -> (DOM code, Windows virtual key code).
KEYS = {
    "End": ("End", 35),
    "Home": ("Home", 36),
    "ArrowLeft": ("ArrowLeft", 37),
    "ArrowUp": ("ArrowUp", 38),
    "ArrowRight": ("ArrowRight", 39),
    "ArrowDown": ("ArrowDown", 40),
    "Enter": ("Enter", 13),
    " ": ("Space", 32),
}


class ChromiumError(RuntimeError):
    """Chromium did not start, died, timed out, or a command or script failed."""


class Chromium:
    """One headless Chromium process; open tabs with :meth:`new_tab`. ``timeout`` bounds each
    command's reply (seconds)."""

    def __init__(self, executable: str | Path, *, timeout: float = 30.0, extra_flags: tuple[str, ...] = ()):
        self.timeout = timeout
        self._profile = Path(tempfile.mkdtemp(prefix="rlds-chromium-"))
        self._log = open(self._profile.parent / f"{self._profile.name}.log", "w+b")  # noqa: SIM115
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # move both ends above 4 first so the child's dup2 calls to 3 and 4 cannot overwrite each other
        high_r = _above(to_browser_r, 10)
        high_w = _above(from_browser_w, 10)

        def pipes_to_3_and_4() -> None:
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)
            # a caller's real-time policy (SVT-AV1 sets one, as root) must not pass to Chromium
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            _no_priority_raise()

        try:
            self._process = subprocess.Popen(
                [
                    str(executable),
                    *FLAGS,
                    *extra_flags,
                    f"--user-data-dir={self._profile}",
                    "--remote-debugging-pipe",
                    "about:blank",
                ],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=self._log,
                preexec_fn=pipes_to_3_and_4,  # before our reader thread starts
                # close_fds would close the new 3 and 4; Python's descriptors are not inheritable
                # (PEP 446), so only 0-4 reach Chromium
                close_fds=False,
                start_new_session=True,  # its own group: close() kills every helper process
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self._log.close()
            self._remove_profile()
            raise ChromiumError(f"cannot start {executable}: {exc}") from exc
        finally:
            for fd in (to_browser_r, from_browser_w, high_r, high_w):
                os.close(fd)
        self._lock = threading.Condition()
        self._replies: dict[int, dict[str, Any]] = {}
        self._tabs: dict[str, Tab] = {}
        self._next_id = 0
        self._dead: str | None = None
        self._abandoned: set[int] = set()  # commands whose reply came too late: dropped
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="chromium-pipe", daemon=True)
        self._reader.start()
        try:
            self.send("Browser.getVersion")
        except ChromiumError:
            self.close()
            raise

    # -- the pipe -------------------------------------------------------------------------
    def _read(self) -> None:
        buffer = b""
        reason = "the pipe from chromium failed"
        try:
            while True:
                chunk = os.read(self._from_browser, 1 << 16)
                if not chunk:
                    reason = f"chromium closed its pipe (exit code {self._process.poll()}){self._log_tail()}"
                    break
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for raw in messages:
                    self._dispatch(json.loads(raw))
        except Exception as exc:  # whatever stops the reader fails every wait at once
            reason = f"the pipe from chromium failed: {type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._dead = reason
                self._lock.notify_all()

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message:
            with self._lock:
                if message["id"] in self._abandoned:
                    self._abandoned.discard(message["id"])
                else:
                    self._replies[message["id"]] = message
                    self._lock.notify_all()
            return
        tab = self._tabs.get(message.get("sessionId", ""))
        if tab is not None:
            tab._event(message["method"], message.get("params", {}))

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Send one protocol command and return its ``result``; raise :class:`ChromiumError` on
        an error reply, a dead browser or no reply within ``timeout`` (default: the browser's)."""
        with self._lock:
            if self._dead:
                raise ChromiumError(self._dead)
            self._next_id += 1
            ident = self._next_id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        try:
            os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        except OSError as exc:
            raise ChromiumError(f"cannot send {method} to chromium: {exc}") from exc
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        with self._lock:
            while ident not in self._replies:
                left = deadline - time.monotonic()
                if self._dead:
                    raise ChromiumError(f"{method}: {self._dead}")
                if left <= 0:
                    self._abandoned.add(ident)
                    raise ChromiumError(f"{method}: no reply from chromium in {limit:g} s")
                self._lock.wait(left)
            reply = self._replies.pop(ident)
        if "error" in reply:
            raise ChromiumError(f"{method}: {reply['error'].get('message', reply['error'])}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    def _log_tail(self) -> str:
        try:
            self._log.flush()
            self._log.seek(0)
            tail = self._log.read()[-400:].decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""
        return f"; its last output: {tail}" if tail else ""

    # -- tabs -----------------------------------------------------------------------------
    def new_tab(self, width: int = 1200, height: int = 900) -> Tab:
        """A new blank tab with a ``width`` x ``height`` CSS-pixel viewport."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        tab = Tab(self, target, session)
        self._tabs[session] = tab
        for domain in ("Page", "Runtime", "Network", "Log"):
            tab.send(f"{domain}.enable")
        tab.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        return tab

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Ask Chromium to close, then kill its process group, wait for the reader thread to end,
        close the pipes and remove the profile (a second call does nothing)."""
        if self._closed:
            return
        self._closed = True
        if self._process.poll() is None and not self._dead:
            with contextlib.suppress(ChromiumError):
                self.send("Browser.close", timeout=min(5.0, self.timeout))
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(min(5.0, self.timeout))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait()
        # a SIGKILL lands when its process next leaves the kernel: under load a renderer can
        # outlive the leader for a moment
        deadline = time.monotonic() + 5.0
        while group_members(self._process.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        # the group is dead, so every write end is closed: the reader stops before its
        # descriptor number can be reused
        self._reader.join(10)
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()
        self._remove_profile()

    def _remove_profile(self) -> None:
        shutil.rmtree(self._profile, ignore_errors=True)
        Path(f"{self._profile}.log").unlink(missing_ok=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Tab:
    """One page of a :class:`Chromium`; ``errors`` lists what went wrong on it (see the module)."""

    def __init__(self, browser: Chromium, target: str, session: str):
        self.browser = browser
        self.target = target
        self.session = session
        self.errors: list[str] = []

    def send(
        self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        """One protocol command to this tab (see :meth:`Chromium.send`)."""
        return self.browser.send(method, params, session=self.session, timeout=timeout)

    def _event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "warning", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.errors.append(f"console.{params['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            self.errors.append(f"uncaught: {_exception_text(params['exceptionDetails'])}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(f"log: {params['entry']['text']}")
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if not url.startswith(("file:", "data:")):
                self.errors.append(f"request: {url}")

    def goto(self, url: str) -> None:
        """Navigate to ``url`` (returns once the navigation is committed, not loaded)."""
        result = self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise ChromiumError(f"cannot open {url}: {result['errorText']}")

    def evaluate(self, expression: str, timeout: float | None = None) -> Any:
        """The value of a JavaScript expression (awaited if a promise), as JSON gives it."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            timeout=timeout,
        )
        if "exceptionDetails" in result:
            raise ChromiumError(f"{expression[:80]!r} failed: {_exception_text(result['exceptionDetails'])}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """Evaluate ``expression`` until it is truthy (every 10 ms); its value, or
        :class:`ChromiumError` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression, timeout=max(0.1, deadline - time.monotonic()))
            except ChromiumError as exc:
                if "no reply from chromium" in str(exc) and time.monotonic() >= deadline:
                    # the last poll outlasted the wait (a busy machine): the wait's own failure
                    raise ChromiumError(
                        f"waited {timeout:g} s for {expression[:120]!r} (the last poll got no answer)"
                    ) from None
                # the document was replaced between two polls (a navigation): poll the new one
                if "context was destroyed" not in str(exc) and "Cannot find context" not in str(exc):
                    raise
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise ChromiumError(f"waited {timeout:g} s for {expression[:120]!r}")
            time.sleep(0.01)

    def inner_text(self, selector: str) -> str:
        """The rendered text of the first element matching ``selector``."""
        text: str = self.evaluate(f"{_element(selector)}.innerText")
        return text

    def box(self, selector: str) -> dict[str, float]:
        """The element's box in viewport CSS pixels (``x``, ``y``, ``width``, ``height``),
        scrolled into view first."""
        box: dict[str, float] = self.evaluate(
            f"(() => {{ const e = {_element(selector)}; e.scrollIntoView({{block: 'center'}});"
            " const r = e.getBoundingClientRect();"
            " return {x: r.x, y: r.y, width: r.width, height: r.height}; })()"
        )
        return box

    def click_at(self, x: float, y: float) -> None:
        """A left click at viewport point (x, y): move, press, release."""
        self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "buttons": 1, "clickCount": 1},
            )

    def click(self, selector: str) -> None:
        """A left click at the middle of the element."""
        box = self.box(selector)
        self.click_at(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)

    def focus(self, selector: str) -> None:
        self.evaluate(f"{_element(selector)}.focus()")

    def press(self, key: str) -> None:
        """Press and release ``key`` (a name of :data:`KEYS`) on the focused element; the browser
        runs the key's default action, as for a user's key."""
        if key not in KEYS:
            raise ChromiumError(f"unknown key {key!r}: one of {', '.join(map(repr, KEYS))}")
        code, vk = KEYS[key]
        common = {"key": key, "code": code, "windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk}
        down: dict[str, Any] = (
            {"type": "keyDown", "text": key, **common} if len(key) == 1 else {"type": "rawKeyDown", **common}
        )
        self.send("Input.dispatchKeyEvent", down)
        self.send("Input.dispatchKeyEvent", {"type": "keyUp", **common})

    def select(self, selector: str, value: str) -> None:
        """Choose ``value`` in a ``<select>``, with the input and change events a user's choice
        fires."""
        self.evaluate(
            f"(() => {{ const e = {_element(selector)}; const v = {json.dumps(value)}; e.value = v;"
            " if (e.value !== v) throw new Error('no option ' + v);"
            " e.dispatchEvent(new Event('input', {bubbles: true}));"
            " e.dispatchEvent(new Event('change', {bubbles: true})); })()"
        )

    def screenshot(self, path: str | Path, full_page: bool = True) -> None:
        """A PNG of the viewport, or of the whole page with ``full_page``."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params.update(
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
            )
        Path(path).write_bytes(base64.b64decode(self.send("Page.captureScreenshot", params)["data"]))

    def close(self) -> None:
        self.browser._tabs.pop(self.session, None)
        self.browser.send("Target.closeTarget", {"targetId": self.target})


def group_members(pgid: int) -> list[int]:
    """The live processes (zombies excluded) of process group ``pgid``, read from ``/proc`` (none
    where there is no ``/proc``)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except (OSError, ValueError):
            continue  # gone meanwhile
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _element(selector: str) -> str:
    """JavaScript for the first element matching ``selector``, throwing when there is none."""
    quoted = json.dumps(selector)
    return f"(document.querySelector({quoted}) ?? (() => {{ throw new Error('no element ' + {quoted}); }})())"


#: ``prctl`` option and Linux capability numbers (linux/prctl.h, linux/capability.h).
_PR_CAPBSET_DROP = 24
_CAP_SYS_NICE = 23


def _no_priority_raise() -> None:
    """In the child before exec: drop ``CAP_SYS_NICE`` from the capability bounding set, so
    Chromium (as root) cannot give threads real-time priority (two at SCHED_FIFO 99 once starved a
    2-core machine past every timeout and SIGKILL). Refused without CAP_SETPCAP, when it is moot."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_CAPBSET_DROP, _CAP_SYS_NICE, 0, 0, 0)


def _exception_text(details: dict[str, Any]) -> str:
    """The first line of a thrown exception's description (its message, without the stack)."""
    text = str(details.get("exception", {}).get("description", details.get("text")))
    return text.splitlines()[0] if text else text


def _above(fd: int, low: int) -> int:
    """A duplicate of ``fd`` numbered ``low`` or more (closed at exec; the child's dup2 copies
    are what it keeps)."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, low)
