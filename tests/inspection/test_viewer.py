"""``rlds show`` / :func:`rlds_cli.inspection.viewer.write_episode_page`: the page's frames are
the dataset's stored image files byte for byte, its series and marks are the episode's, and
every refusal is one line with nothing written. The page in a real browser:
``test_viewer_browser.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.ted import StepBlock
from rlds_cli.cli.app import app
from rlds_cli.errors import CorruptDatasetError, InvalidSelectionError, ViewerError
from rlds_cli.frames.codecs import FrameFormat, decode
from rlds_cli.inspection import viewer
from rlds_cli.inspection.viewer import FRAMES_PER_CHUNK, episode_page, write_episode_page
from tests.formats_fixtures import refused
from tests.inspection.audit_fixtures import episodes
from tests.inspection.viewer_fixtures import build_viewer_dataset, page_data, page_frames, stored_frames

pytestmark = [pytest.mark.usefixtures("consoles"), pytest.mark.console_widths(250, 250)]
runner = CliRunner()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache with ``faulty`` (the audit's faults, PNG frames) and ``rawcam`` (the same, frames
    stored as raw arrays)."""
    folder = tmp_path_factory.mktemp("viewer")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLDS_FSYNC", "0")
        build_viewer_dataset(folder, "faulty")
        build_viewer_dataset(folder, "rawcam", frames=None)
    return folder


def invoke(*args: object) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def test_the_page_embeds_the_stored_frames_byte_for_byte(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "page.html"
    summary = write_episode_page("faulty", out, episodes=[4, 0], root=root)
    page = out.read_bytes()
    ds = open_dataset("faulty", root)
    frames = page_frames(page)
    for e, pos in enumerate([4, 0]):
        assert frames[(e, 0)] == stored_frames(ds, "pixels", pos)
    stored = sum(len(f) for f in frames[(0, 0)] + frames[(1, 0)])
    assert summary.frame_bytes == stored and summary.nbytes == len(page) == out.stat().st_size
    assert summary.episodes == [4, 0] and summary.cameras == ["pixels"] and summary.encoded == []
    assert summary.steps == int(ds.episode_index["length"][4] + ds.episode_index["length"][0])
    data = page_data(page)
    assert [c["mime"] for c in data["cameras"]] == ["image/png"] and data["chunk"] == FRAMES_PER_CHUNK
    assert page == episode_page("faulty", episodes=[4, 0], root=root)  # the same page as bytes
    assert b"http://" not in page and b"https://" not in page and b" src=" not in page  # nothing fetched


def test_series_stats_and_audit_marks_are_the_episodes(root: Path) -> None:
    data = page_data(episode_page("faulty", episodes=[2, 4, 6, 12, 9], root=root))
    source = episodes(faults=True)
    by_pos = {e["index"]: e for e in data["episodes"]}
    plots = {p["key"]: p for p in by_pos[6]["plots"]}
    assert next(iter(plots)) == "action"  # actions drawn first
    np.testing.assert_allclose(np.array(plots["action"]["dims"]).T, source[6]["action"], rtol=1e-5)
    np.testing.assert_allclose(np.array(plots["state"]["dims"]).T, source[6]["state"][:-1], rtol=1e-5)
    marks = {pos: {m["kind"]: m["ranges"] for m in e["marks"]} for pos, e in by_pos.items()}
    assert marks[2]["idle"] == [[11, 41]]  # action, state and frame held from step 10 to 40
    assert "frozen" not in marks[2]  # a camera still while the robot is idle is not frozen
    assert marks[4]["frozen"] == [[21, 31]]
    assert marks[6]["spike"] == [[30, 32]]  # the jump at step 30 and back at 31
    assert marks[12]["nonfinite"] == [[5, 6]]
    assert marks[9]["end"] == [[len(source[9]["action"]) - 1, len(source[9]["action"])]]
    assert by_pos[4]["flags"] == ["frozen:pixels"] and by_pos[9]["flags"] == []
    assert by_pos[12]["plots"][1]["dims"][1][5] is None  # the NaN state value, as null
    stats = dict(by_pos[6]["stats"])
    assert stats["return"] == f"{float(np.sum(source[6]['next/reward'], dtype=np.float64)):.4g}"
    assert stats["audit flags"] == "spike" and stats["steps"] == str(len(source[6]["action"]))
    assert data["audited"] is True and data["fps"] == 30


def test_without_the_audit_there_are_no_flags(root: Path) -> None:
    data = page_data(episode_page("faulty", episodes=[4], audit_flags=False, fps=10, root=root))
    (e,) = data["episodes"]
    assert data["audited"] is False and e["flags"] == [] and data["fps"] == 10
    assert {m["kind"] for m in e["marks"]} >= {"frozen", "idle", "end"}  # drawn from the episode alone
    assert "audit flags" not in dict(e["stats"])


def test_raw_frames_are_encoded_for_the_page(root: Path) -> None:
    page = episode_page("rawcam", episodes=[3], root=root)
    (files,) = page_frames(page).values()
    raw = np.asarray(open_dataset("rawcam", root).episode(3, ["pixels"])["pixels"])
    assert len(files) == len(raw) and all(f.startswith(b"\xff\xd8\xff") for f in files)
    fmt = FrameFormat("jpeg", raw.shape[1:])
    err = np.abs(np.stack([decode(f, fmt) for f in files]).astype(int) - raw.astype(int))
    assert err.mean() < 12  # JPEG at quality 90 of 8x8 random pixels: close, not equal
    assert page_data(page)["cameras"][0]["mime"] == "image/jpeg"


def test_a_view_shows_its_parents_frames(root: Path, tmp_path: Path) -> None:
    """A view's frames are read through its rows: decoded and encoded again (PNG: lossless)."""
    assert invoke("view", "faulty", "--episodes", "3,4,5", "--name", "three", "--root", root).exit_code == 0
    page = episode_page("three", episodes=[1], root=root)
    parent = open_dataset("faulty", root)
    fmt = parent.stored_fields["pixels"].frame_format
    assert fmt is not None
    shown = [decode(f, fmt) for f in page_frames(page)[(0, 0)]]
    np.testing.assert_array_equal(
        np.stack(shown), [decode(f, fmt) for f in stored_frames(parent, "pixels", 4)]
    )


def test_cli_writes_the_page_and_says_what_it_holds(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "p.html"
    result = invoke("show", "faulty", "--episode", "4", "-e", "-1", "-o", out, "--root", root, "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["path"] == str(out) and info["episodes"] == [4, 19] and info["bytes"] == out.stat().st_size
    assert info["cameras"] == ["pixels"] and info["audited"] is True
    monkeypatch.chdir(tmp_path)
    text = invoke("show", "faulty", "--root", root, "--no-audit")
    assert text.exit_code == 0 and "faulty-episode-0.html" in text.stdout and "1 episode" in text.stdout
    assert page_data((tmp_path / "faulty-episode-0.html").read_bytes())["audited"] is False
    quiet = invoke("show", "faulty", "-o", "q.html", "--root", root, "-q")
    assert quiet.stdout.strip() == "q.html" and (tmp_path / "q.html").is_file()


def test_cli_shows_a_zarr_dataset_at_a_url(tmp_path: Path, isolated_cache: Path) -> None:
    from rlds_cli.remote.push import push

    build_viewer_dataset(isolated_cache, "z", faults=False, backend="zarr")
    push("z", f"file://{tmp_path}/bucket/z")
    out = tmp_path / "remote.html"
    result = invoke("show", f"file://{tmp_path}/bucket/z", "-e", "2", "-o", out)
    assert result.exit_code == 0, result.output
    local = open_dataset("z")
    assert page_frames(out.read_bytes())[(0, 0)] == stored_frames(local, "pixels", 2)
    assert page_data(out.read_bytes())["episodes"][0]["length"] == int(local.episode_index["length"][2])


def test_a_page_of_a_dataset_at_a_url_compares_frames_in_few_requests(
    tmp_path: Path, isolated_cache: Path
) -> None:
    """The frozen-camera checks (the page's and the audit's) fetch the equal-sized frame pairs they
    compare together, merged into few requests (a request per frame of each pair made 502 requests
    for this page, each paying the store's latency; now 87, for 1.7x the bytes: the gaps merged),
    and find what they find on the local copy: the same marks and flags, frozen frames included."""
    import rlds_cli
    from rlds_cli.remote.push import push

    build_viewer_dataset(isolated_cache, "z", backend="zarr")
    push("z", f"file://{tmp_path}/bucket/z")
    remote = rlds_cli.open_dataset(f"file://{tmp_path}/bucket/z")
    requests, fetched = remote.requests, remote.bytes_fetched
    write_episode_page(remote, tmp_path / "remote.html", episodes=[4, 2])
    assert remote.requests - requests <= 120
    assert remote.bytes_fetched - fetched <= 2 * remote.size_bytes()
    write_episode_page("z", tmp_path / "local.html", episodes=[4, 2])
    pages = [page_data((tmp_path / f"{side}.html").read_bytes()) for side in ("remote", "local")]
    marks = [[(e["marks"], e["flags"]) for e in page["episodes"]] for page in pages]
    assert marks[0] == marks[1]
    assert any(m["kind"] == "frozen" for m in pages[0]["episodes"][0]["marks"])
    local = open_dataset("z")
    assert page_frames((tmp_path / "remote.html").read_bytes())[(0, 0)] == stored_frames(local, "pixels", 4)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["faulty", "-e", "20"], ["episode 20 is outside dataset 'faulty'", "20 episodes"]),
        (["faulty", "-e", "-21"], ["episode -21 is outside"]),
        (["faulty", "--fps", "0"], ["fps must be a finite number above 0"]),
        (["faulty", "--fps", "inf"], ["fps must be a finite number above 0, got inf"]),
        (["ghost"], ["ghost"]),
        (["faulty", "-o", "{tmp}/missing/p.html"], ["its folder {tmp}/missing does not exist"]),
        (["faulty", "-o", "{tmp}"], ["it is a folder"]),
        (["faulty", "-o", "{tmp}/notes.txt/p.html"], ["{tmp}/notes.txt is a file, not a folder"]),
    ],
)
def test_refusals_are_one_line_and_write_nothing(
    root: Path, tmp_path: Path, args: list[str], needles: list[str]
) -> None:
    (tmp_path / "notes.txt").write_text("keep")  # said "its folder notes.txt does not exist"
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "-o" not in args:
        args += ["-o", str(tmp_path / "p.html")]
    result = invoke("show", *args, "--root", root)
    refused(result, *(n.replace("{tmp}", str(tmp_path)) for n in needles), home=tmp_path / "none")
    assert not (tmp_path / "p.html").exists()


def test_library_refusals(root: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidSelectionError, match="no episode"):
        episode_page("faulty", episodes=[], root=root)
    with pytest.raises(InvalidSelectionError, match="at most 64"):  # (the CLI shows each episode once)
        episode_page("faulty", episodes=[i % 20 for i in range(65)], root=root)
    with pytest.raises(InvalidSelectionError, match=r"rlds_cli\.open_dataset"):
        episode_page("s3://bucket/x", root=root)
    with pytest.raises(ViewerError, match="does not exist"):
        write_episode_page("faulty", tmp_path / "no" / "p.html", root=root)


def test_a_failure_leaves_the_old_page_and_no_temp_file(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "p.html"
    write_episode_page("faulty", out, episodes=[0], audit_flags=False, root=root)
    old = out.read_bytes()

    def broken(self: object, cam: object, pos: int) -> object:
        yield [b"x"]
        raise OSError("disk gone")

    monkeypatch.setattr(viewer.EpisodeContent, "frames", broken)
    with pytest.raises(OSError, match="disk gone"):
        write_episode_page("faulty", out, episodes=[1], audit_flags=False, root=root)
    assert out.read_bytes() == old and sorted(p.name for p in tmp_path.iterdir()) == ["p.html"]


def test_a_dataset_without_cameras_and_a_channels_first_camera(tmp_path: Path, ted_dataset: Any) -> None:
    """A low-dim dataset's page has plots and no camera; raw (C, H, W) frames are shown as images."""
    ds = ted_dataset([5, 7], "lowdim", root=tmp_path / "low")
    data = page_data(episode_page(ds, episodes=[1]))
    assert data["cameras"] == [] and data["episodes"][0]["length"] == 7
    np.testing.assert_allclose(
        data["episodes"][0]["plots"][0]["dims"][1], -np.arange(5, 12)
    )  # action[:, 1] = -i
    frames = np.random.default_rng(0).integers(0, 256, (13, 3, 16, 24), np.uint8)
    with DatasetBuilder("chw", root=tmp_path, frames=None) as builder:
        last = np.arange(12)[:, None] == 11
        steps = {"action": np.zeros((12, 1), np.float32), "next/reward": np.zeros((12, 1), np.float32),
                 "next/terminated": np.zeros((12, 1), bool), "next/truncated": last}  # fmt: skip
        builder.append(StepBlock(steps=steps, observations={"image": frames}, ends=np.array([11])))
        builder.commit()
    page = episode_page("chw", root=tmp_path)
    files = page_frames(page)[(0, 0)]
    shown = np.stack([decode(f, FrameFormat("jpeg", (3, 16, 24), channels_first=True)) for f in files])
    assert shown.shape == (12, 3, 16, 24)
    assert np.abs(shown.astype(int) - frames[:12].astype(int)).mean() < 20
    assert page_data(page)["cameras"][0]["width"] == 24


@pytest.mark.parametrize("damage", ["forged size", "flipped bit"])
def test_a_damaged_stored_frame_is_refused_not_shown(tmp_path: Path, damage: str) -> None:
    """The page copies stored image files without decoding them: a frame whose header declared
    60000x60000, or a PNG whose data failed its CRC (other pixels), was embedded, exit 0, where the
    loader refuses it."""
    import struct
    import zlib

    build_viewer_dataset(tmp_path, "cam", faults=False)
    ds = open_dataset("cam", tmp_path)
    path = tmp_path / "datasets" / "cam" / "arrays" / "pixels@frames"
    start = int(np.load(path.with_name("pixels@ends.npy"))[2])  # frame 3 of episode 0
    data = bytearray(path.read_bytes())
    if damage == "forged size":  # the IHDR chunk, its CRC made right
        data[start + 16 : start + 24] = struct.pack(">II", 60000, 60000)
        data[start + 29 : start + 33] = struct.pack(">I", zlib.crc32(bytes(data[start + 12 : start + 29])))
    else:
        data[start + 60] ^= 0x04  # inside the IDAT chunk
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptDatasetError, match=r"frame 3 of 'pixels' of dataset 'cam' .* is damaged"):
        ds.column("pixels")[3]
    out = tmp_path / "p.html"
    # the audit's pass checks the digests first; without it, the page checks each frame it embeds
    result = invoke("show", "cam", "-e", "0", "-o", out, "--root", tmp_path)
    refused(result, "dataset 'cam' is damaged: 'pixels'", home=tmp_path / "none")
    result = invoke("show", "cam", "-e", "0", "-o", out, "--root", tmp_path, "--no-audit")
    refused(result, "frame 3 of 'pixels' of dataset 'cam'", "is damaged", home=tmp_path / "none")
    assert not out.exists()


def test_each_episode_is_shown_once_and_minus_one_is_the_last(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-e 1 -e 2 -e 1`` showed episode 1 twice; ``-e -1`` wrote ``NAME-episode--1.html``."""
    monkeypatch.chdir(tmp_path)
    last = open_dataset("faulty", root).num_episodes - 1
    result = invoke("show", "faulty", "-e", "-1", "-e", "1", "-e", str(last), "--root", root, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["episodes"] == [last, 1]
    assert (tmp_path / f"faulty-episode-{last}.html").exists()
