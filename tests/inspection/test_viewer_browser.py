"""The ``rlds show`` page in a real headless Chromium (Debian's ``chromium``, driven over the
DevTools protocol on a pipe by :mod:`rlds_cli.testing.headless_chromium`; no browser download):
it loads with no console error and asks for nothing but the file, the frame shown at step t is
step t's frame (its bytes and its pixels), the scrubber, the timeline and the play button move the
frames and the plots, and a screenshot is kept (``tests/artifacts/viewer.png``, git-ignored;
``docs/images/viewer.png`` is a copy of it).

Skipped, with the reason, where chromium is missing (``make install-test`` installs it where it
can)."""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache.opening import open_dataset
from rlds_cli.frames.codecs import decode
from rlds_cli.inspection.viewer import write_episode_page
from rlds_cli.testing.headless_chromium import Chromium, Tab
from tests.inspection.viewer_fixtures import build_viewer_dataset, stored_frames

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)"),
    # meant to keep the browsers on one worker; pytest 9.2 with xdist 3.8 does not honour it
    # (a module's tests were seen on both workers), and two browsers at once are fine
    pytest.mark.xdist_group("browser"),
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    """One headless Chromium for the module, killed whatever happens."""
    assert CHROMIUM is not None
    with Chromium(CHROMIUM) as chromium:
        yield chromium


@pytest.fixture(scope="module")
def page_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The page of episodes 4 (a frozen camera), 6 (an action spike) and 14 (300 steps: its
    frames in three chunks) of the viewer fixture; returns (page, cache root)."""
    root = tmp_path_factory.mktemp("viewer-browser")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLDS_FSYNC", "0")
        build_viewer_dataset(root, "faulty")
    out = root / "page.html"
    write_episode_page("faulty", out, episodes=[4, 6, 14], root=root)
    return out, root


@pytest.fixture
def tab(browser: Chromium, page_file: tuple[Path, Path]) -> Iterator[Tab]:
    """The page opened and ready in a fresh 1200x900 tab; fails the test on any console error
    or warning, uncaught exception, and any request for something else than the file itself and
    its ``data:`` frames (no CDN, no server)."""
    page = browser.new_tab(1200, 900)
    try:
        page.goto(page_file[0].as_uri())
        page.wait_for("document.querySelector('html[data-ready=true]') !== null")
        yield page
        assert page.errors == []
    finally:
        page.close()


def shown(tab: Tab, camera: int = 0) -> bytes:
    """The image file camera ``camera``'s <img> shows (its data: URL's bytes)."""
    src = tab.evaluate(f"document.getElementById('cam{camera}').src")
    head, _, data = src.partition(",")
    assert head == "data:image/png;base64"
    return base64.b64decode(data)


def pixels(tab: Tab, camera: int = 0) -> np.ndarray:
    """The pixels the browser decoded for the shown <img> (drawn on a canvas, read back)."""
    w, h, data = tab.evaluate(
        f"(i => {{ const c = document.createElement('canvas');"
        " c.width = i.naturalWidth; c.height = i.naturalHeight;"
        " const g = c.getContext('2d'); g.drawImage(i, 0, 0);"
        " return [c.width, c.height, Array.from(g.getImageData(0, 0, c.width, c.height).data)]; })"
        f"(document.getElementById('cam{camera}'))"
    )
    return np.array(data, np.uint8).reshape(h, w, 4)[:, :, :3]


def wait_step(tab: Tab, step: int) -> None:
    tab.wait_for(
        f"(() => {{ const i = document.getElementById('cam0'); return i.dataset.step === '0:{step}' "
        "&& i.complete && i.naturalWidth > 0; })()"
    )


def test_the_frame_shown_at_step_t_is_step_ts_frame(tab: Tab, page_file: tuple[Path, Path]) -> None:
    ds = open_dataset("faulty", page_file[1])
    frames = stored_frames(ds, "pixels", 4)
    fmt = ds.stored_fields["pixels"].frame_format
    assert fmt is not None
    for t in (0, 17, 25, len(frames) - 1):
        tab.evaluate(f"rldsViewer.seek({t})")
        wait_step(tab, t)
        assert tab.evaluate("rldsViewer.step") == t
        assert shown(tab) == frames[t]
        np.testing.assert_array_equal(pixels(tab), decode(frames[t], fmt))  # PNG: exact pixels
    assert tab.inner_text("#step").startswith(f"step {len(frames) - 1} / {len(frames) - 1}")


def test_the_scrubber_moves_frames_and_plots(tab: Tab, page_file: tuple[Path, Path]) -> None:
    ds = open_dataset("faulty", page_file[1])
    frames = stored_frames(ds, "pixels", 4)
    action = np.asarray(ds.episode(4, ["action"])["action"])
    cursor = "document.querySelector('.plot .cursor').style.left"
    before = tab.evaluate(cursor)
    tab.focus("#scrub")
    tab.press("End")  # the range input's own keys: an input event, as a drag gives
    last = len(frames) - 1
    wait_step(tab, last)
    assert shown(tab) == frames[last] and tab.evaluate(cursor) != before
    assert float(tab.evaluate(cursor).rstrip("%")) > 95
    title = tab.inner_text(".plot .title")
    assert title.startswith("action: ") and f"{action[last, 0]:.4f}".rstrip("0")[:5] in title
    for _ in range(3):
        tab.press("ArrowLeft")
    wait_step(tab, last - 3)
    assert shown(tab) == frames[last - 3]
    box = tab.box("#timeline")  # a click on the timeline seeks there
    tab.click_at(box["x"] + box["width"] * 0.5, box["y"] + box["height"] / 2)
    step = tab.evaluate("rldsViewer.step")
    assert abs(step - len(frames) / 2) <= 1
    wait_step(tab, step)
    assert shown(tab) == frames[step]


def test_play_advances_and_the_episode_menu_switches(tab: Tab, page_file: tuple[Path, Path]) -> None:
    tab.click("#play")
    tab.wait_for("rldsViewer.step >= 5")
    tab.click("#play")
    assert tab.inner_text("#play") == "play"
    tab.select("#episode", "1")
    ds = open_dataset("faulty", page_file[1])
    frames = stored_frames(ds, "pixels", 6)
    tab.evaluate("rldsViewer.seek(30)")
    tab.wait_for("document.getElementById('cam0').dataset.step === '1:30'")
    assert shown(tab) == frames[30]
    assert tab.inner_text("#badges") == "spike"
    assert "action spike" in tab.inner_text("#legend")


def test_frames_across_chunks_are_each_steps(tab: Tab, page_file: tuple[Path, Path]) -> None:
    frames = stored_frames(open_dataset("faulty", page_file[1]), "pixels", 14)
    tab.evaluate("rldsViewer.showEpisode(2)")
    for t in (127, 128, 255, 256, len(frames) - 1):  # the chunks' edges (128 frames each)
        tab.evaluate(f"rldsViewer.seek({t})")
        tab.wait_for(f"document.getElementById('cam0').dataset.step === '2:{t}'")
        assert shown(tab) == frames[t]


def test_a_screenshot_is_kept(tab: Tab) -> None:
    tab.evaluate("rldsViewer.seek(25)")
    wait_step(tab, 25)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "viewer.png"
    tab.screenshot(shot, full_page=True)
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
