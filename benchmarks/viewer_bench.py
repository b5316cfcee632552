"""``rlds show``: how fast a long episode's page is made and opens, and what it weighs (issue 43)::

    python benchmarks/viewer_bench.py --minutes 10 --cameras 3 --fps 30

One episode of ``--minutes`` at ``--fps`` (10 minutes at 30 fps: 18,000 steps) with ``--cameras``
224x224 RGB cameras is written under a temporary cache root. Its frames are MuJoCo renders
(:mod:`camera_frames`, 1,200 of them, repeated; camera ``k`` starts ``k * 400`` frames later),
encoded once as JPEG at the default quality (93, 4:4:4) and stored as they are (``--frames
keep``); 7-dim actions, 14-dim states and a reward per step.

* **Page.** :func:`rlds_cli.inspection.viewer.write_episode_page` writes the page (audit
  included: one pass over the dataset); its wall time, the page's bytes and the frames' stored
  bytes.
* **Open.** Headless Chromium (``/usr/bin/chromium``, driven by
  ``rlds_cli.testing.headless_chromium``) opens the file; times from ``goto`` to
  ``<html data-ready="true">`` (the first frames of every camera shown, the
  plots drawn), to ``DOMContentLoaded`` (the whole file read) and to the last step's frames shown
  after a seek there. Best of ``--repeats`` fresh browsers.
* **rerun.** Where rerun-sdk is installed, :func:`rlds_cli.inspection.viewer.write_rerun`
  (no audit): its wall time and the recording's bytes.

Prints markdown tables.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import camera_frames

CHROMIUM = "/usr/bin/chromium"
BLOCK = 1200


def build(root: Path, steps: int, cameras: int) -> None:
    """The benchmark's dataset ``long`` of one episode (see the module docstring)."""
    import numpy as np

    from rlds_cli.cache.builder import DatasetBuilder
    from rlds_cli.cache.ted import StepBlock
    from rlds_cli.frames.codecs import DEFAULT_JPEG_QUALITY, EncodedFrames, FrameFormat, encode_many

    frames = np.load(camera_frames.cached(BLOCK))
    fmt = FrameFormat("jpeg", frames.shape[1:])
    jpegs = encode_many(frames, fmt, DEFAULT_JPEG_QUALITY)
    rng = np.random.default_rng(0)
    with DatasetBuilder("long", root=root, frames="keep") as builder:
        for a in range(0, steps, BLOCK):
            n = min(BLOCK, steps - a)
            last = a + n == steps
            rows = n + (1 if last else 0)  # the final observation after the last step
            obs: dict[str, object] = {"state": rng.normal(size=(rows, 14)).astype(np.float32)}
            for k in range(cameras):
                obs[f"camera{k}"] = EncodedFrames(
                    [jpegs[(a + i + 400 * k) % BLOCK] for i in range(rows)], fmt
                )
            truncated = np.zeros((n, 1), bool)
            truncated[-1] = last
            builder.append(
                StepBlock(
                    steps={
                        "action": np.cumsum(rng.normal(scale=0.05, size=(n, 7)), axis=0).astype(np.float32),
                        "next/reward": rng.uniform(size=(n, 1)).astype(np.float32),
                        "next/terminated": np.zeros((n, 1), bool),
                        "next/truncated": truncated,
                    },
                    observations=obs,  # type: ignore[arg-type]
                    ends=np.array([n - 1]) if last else np.zeros(0, np.int64),
                )
            )
        builder.commit(source={"generator": "viewer_bench"})


def open_times(page: Path, last_step: int) -> tuple[float, float, float]:
    """Seconds from the navigation to ready, to DOMContentLoaded, and to the last step's frames."""
    from rlds_cli.testing.headless_chromium import Chromium

    with Chromium(CHROMIUM, timeout=600) as browser:
        tab = browser.new_tab(1280, 900)
        start = time.perf_counter()
        tab.goto(page.as_uri())
        tab.wait_for("document.querySelector('html[data-ready=true]') !== null", timeout=600)
        ready = time.perf_counter() - start
        tab.wait_for("document.readyState !== 'loading'", timeout=600)
        parsed = time.perf_counter() - start
        tab.evaluate(f"rldsViewer.seek({last_step})")
        tab.wait_for(
            "[...document.querySelectorAll('#cams img')].every(i => i.dataset.step.endsWith(':'"
            f" + {last_step}) && i.complete && i.naturalWidth > 0)",
            timeout=600,
        )
        end = time.perf_counter() - start
        if tab.errors:
            raise RuntimeError(f"the page logged errors: {tab.errors[:3]}")
    return ready, parsed, end


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--fps", type=int, default=30)
    p.add_argument("--cameras", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--root", type=Path, default=None)
    a = p.parse_args(argv)
    root = a.root or Path(tempfile.mkdtemp(prefix="rlds-viewer-bench-"))
    os.environ["RLDS_HOME"] = str(root)
    os.environ.setdefault("RLDS_FSYNC", "0")
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.inspection.viewer import write_episode_page

    steps = int(a.minutes * 60 * a.fps)
    try:
        if not (root / "datasets" / "long").is_dir():
            build(root, steps, a.cameras)
        ds = open_dataset("long")
        page = root / "long.html"
        start = time.perf_counter()
        summary = write_episode_page(ds, page, fps=a.fps)
        made = time.perf_counter() - start
        rrd: tuple[float, int] | None = None
        try:
            from rlds_cli.inspection.viewer import write_rerun

            start = time.perf_counter()
            recording = write_rerun(ds, root / "long.rrd", audit_flags=False, fps=a.fps)
            rrd = (time.perf_counter() - start, recording.nbytes)
        except ImportError:
            pass
        opened = [open_times(page, steps - 1) for _ in range(a.repeats)]
        ready, parsed, end = (min(t[i] for t in opened) for i in range(3))
        print(f"episode: {steps:,} steps ({a.minutes:g} min at {a.fps} fps), {a.cameras} cameras "
              f"224x224 JPEG, {a.cameras * steps:,} frames\n")  # fmt: skip
        print("| page | seconds |\n|---|---:|")
        print(f"| written (`write_episode_page`, audit included) | {made:.1f} |")
        print(f"| open to ready (first frames shown, plots drawn) | {ready:.2f} |")
        print(f"| open to DOMContentLoaded (whole file read) | {parsed:.2f} |")
        print(f"| open to the last step's frames shown | {end:.2f} |")
        if rrd is not None:
            label = f"`--rerun` recording written (`write_rerun`, no audit; {rrd[1] / 1e6:,.0f} MB)"
            print(f"| {label} | {rrd[0]:.1f} |")
        mb = 1e6
        print("\n| bytes | MB |\n|---|---:|")
        print(f"| the episode's compressed frames | {summary.frame_bytes / mb:,.1f} |")
        print(f"| the page | {summary.nbytes / mb:,.1f} ({summary.nbytes / summary.frame_bytes:.2f}x) |")
    finally:
        if a.root is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
