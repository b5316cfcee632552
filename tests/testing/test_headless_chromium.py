"""The DevTools-over-a-pipe driver of the viewer's browser tests: every failure is a
ChromiumError in bounded time (a script error, a wait that never ends, a browser that dies, a
missing executable), nothing is left running, and a tab's errors are collected."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from rlds_cli.testing.headless_chromium import Chromium, ChromiumError, group_members

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)"),
    pytest.mark.xdist_group("browser"),  # not honoured by pytest 9.2 + xdist 3.8: harmless
]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"


def test_a_page_is_driven_and_its_errors_collected(tmp_path: Path) -> None:
    page = tmp_path / "p.html"
    page.write_text(
        "<html><body><input id=r type=range min=0 max=10 value=5>"
        "<select id=s><option>a</option><option>b</option></select><p id=t>hello</p>"
        "<script>console.error('broken'); fetch('http://127.0.0.1:9/x').catch(() => 0);</script>"
        "</body></html>"
    )
    assert CHROMIUM is not None
    with Chromium(CHROMIUM) as browser:
        tab = browser.new_tab(800, 600)
        tab.goto(page.as_uri())
        tab.wait_for("document.readyState === 'complete'")
        tab.focus("#r")
        tab.press("End")
        assert tab.evaluate("document.getElementById('r').value") == "10"
        tab.press("ArrowLeft")
        assert tab.evaluate("document.getElementById('r').value") == "9"
        tab.select("#s", "b")
        assert tab.evaluate("document.getElementById('s').value") == "b"
        assert tab.inner_text("#t") == "hello"
        assert tab.evaluate("[innerWidth, innerHeight]") == [800, 600]
        deadline = time.monotonic() + 30  # the events arrive on the reader thread
        while not any(e.startswith("request: http://127.0.0.1:9/x") for e in tab.errors):
            assert time.monotonic() < deadline, tab.errors
            time.sleep(0.01)
        assert "console.error: broken" in tab.errors
        shot = tmp_path / "shot.png"
        tab.screenshot(shot)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        tab.close()


def test_failures_are_errors_in_bounded_time(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    with Chromium(CHROMIUM) as browser:
        tab = browser.new_tab()
        with pytest.raises(ChromiumError, match=r"nosuch.*ReferenceError"):
            tab.evaluate("nosuch.thing")
        with pytest.raises(ChromiumError, match="no element #missing"):
            tab.inner_text("#missing")
        with pytest.raises(ChromiumError, match="no option z"):
            tab.evaluate("document.body.innerHTML = '<select id=s><option>a</option></select>'")
            tab.select("#s", "z")
        with pytest.raises(ChromiumError, match="unknown key 'F13'"):
            tab.press("F13")
        start = time.monotonic()
        with pytest.raises(ChromiumError, match=r"waited 0.2 s for 'false'"):
            tab.wait_for("false", timeout=0.2)
        assert time.monotonic() - start < 5


def test_a_browser_that_dies_fails_the_wait_and_leaves_nothing(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    browser = Chromium(CHROMIUM)
    pid = browser._process.pid
    profile = browser._profile
    tab = browser.new_tab()
    os.killpg(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(ChromiumError, match=r"closed its pipe|failed|cannot send .* Broken pipe"):
        tab.wait_for("false", timeout=60)
    assert time.monotonic() - start < 10
    browser.close()
    assert not _alive(pid) and group_members(pid) == [] and not profile.exists()
    assert not browser._reader.is_alive()
    browser.close()  # a second close does nothing (no descriptor closed twice)


def test_close_kills_every_helper_and_removes_the_profile() -> None:
    assert CHROMIUM is not None
    browser = Chromium(CHROMIUM)
    browser.new_tab()
    pid, profile = browser._process.pid, browser._profile
    assert group_members(pid)  # the browser and its renderers share its group
    browser.close()
    assert group_members(pid) == [] and not profile.exists()


def test_a_browser_that_never_answers_fails_in_bounded_time(tmp_path: Path) -> None:
    silent = tmp_path / "silent-chromium"
    silent.write_text("#!/bin/sh\nexec sleep 60\n")  # ignores fds 3 and 4: no reply ever comes
    silent.chmod(0o755)
    start = time.monotonic()
    with pytest.raises(ChromiumError, match=r"Browser.getVersion: no reply from chromium in 1 s"):
        Chromium(silent, timeout=1)
    assert time.monotonic() - start < 20


def test_no_thread_of_chromium_runs_at_a_raised_priority() -> None:
    # run as root, Chromium gave threads real-time priority; two spun at SCHED_FIFO 99 and
    # starved the machine (the suite hung): the driver takes that right away from it
    assert CHROMIUM is not None
    with Chromium(CHROMIUM) as browser:
        tab = browser.new_tab()
        tab.goto("data:text/html,<p>busy</p>")
        tab.wait_for("document.readyState === 'complete'")
        found = []
        for pid in group_members(browser._process.pid):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    fields = (task / "stat").read_text().rsplit(")", 1)[-1].split()
                    found.append((int(fields[15]), int(fields[16])))  # priority, nice
        assert found and all(priority >= 20 and nice >= 0 for priority, nice in found), sorted(found)[:5]


def test_a_missing_executable_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(ChromiumError, match=r"cannot start .*nosuch-chromium"):
        Chromium(tmp_path / "nosuch-chromium")
