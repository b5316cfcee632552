"""``rlds show``: episodes of a dataset to watch: one self-contained HTML page that plays them in a
browser, or a recording for the rerun viewer.

:func:`write_episode_page` writes the page atomically; :func:`episode_page` returns its bytes. The
page needs no server or network: camera frames play in sync with plots of the actions, low-dim
observations, rewards and end flags; the timeline shows the audit's marks
(:mod:`rlds_cli.inspection.audit`); a table gives the episode's statistics and audit flags. Its
fixed parts (style, layout, script) are ``rlds_cli/data/viewer.html``: the page is that file with
the title filled in, the data (``<script type="application/json" id="rlds-data">``: cameras,
per-episode series, audit marks, statistics) at ``<!-- rlds:data -->`` and the frames at
``<!-- rlds:frames -->``, as ``<script type="text/plain" id="f{episode}-{camera}-{chunk}"
data-n="...">`` elements of :data:`FRAMES_PER_CHUNK` frames base64-encoded one by one (``data-n``:
each one's length in characters). The page is ready (``<html data-ready="true">``) when its first
frames are shown.

Stored frame files (JPEG/PNG/WebP) are embedded byte for byte, base64-encoded (4/3 of their size);
raw ``uint8`` frames are encoded for the page (JPEG at :data:`RAW_JPEG_QUALITY`; PNG for 4
channels). Memory is bounded: frames go :data:`FRAMES_PER_CHUNK` at a time.

``rlds show --rerun FILE.rrd`` (the ``rerun`` extra, ``rerun-sdk``) writes the same content
(:class:`EpisodeContent`) atomically, per episode ``I``: each camera's frames at
``episode/<I>/<key>`` as ``EncodedImage`` (the stored files), every plotted dimension at
``episode/<I>/<key>/<d>`` as ``Scalars``, both on the ``step`` and ``time`` (page fps) timelines;
the audit's marks as ``TextLog`` entries at each range's start; the statistics as a static
``TextDocument`` at ``episode/<I>/stats``.
"""

from __future__ import annotations

import base64
import functools
import html
import importlib.resources
import io
import json
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from rlds_cli._util.io import atomic_path, atomic_write, refuse_foreign_output
from rlds_cli.cache.backends.frames import FramesColumn
from rlds_cli.cache.card import dataset_fps
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.layout import is_url
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.root import CacheRoot, refuse_cache_output
from rlds_cli.catalog.registry import resolve_name
from rlds_cli.errors import FrameError, InvalidSelectionError, ViewerError, import_extra
from rlds_cli.frames.codecs import FrameFormat, check_frame, encode_many, frame_shape_problem
from rlds_cli.inspection.audit import AuditReport, AuditTolerances, KeyRoles, audit

__all__ = [
    "FRAMES_PER_CHUNK",
    "Camera",
    "EpisodeContent",
    "PageSummary",
    "RerunSummary",
    "episode_page",
    "write_episode_page",
    "write_rerun",
]


#: In the head of every page (``data/viewer.html``): a later run may write over a page that has it.
PAGE_MARK = b'<meta name="generator" content="rlds show">'
#: Frames per ``<script>`` element of the page (one read and one write of the stored bytes).
FRAMES_PER_CHUNK = 128
#: JPEG quality of frames stored raw, encoded for the page.
RAW_JPEG_QUALITY = 90
#: Dimensions of one key drawn (a wider key's first ones; the page says so).
MAX_PLOT_DIMS = 32
#: Episodes one page may hold (every episode's series is in the page's data).
MAX_EPISODES = 64
#: Playback rate where the dataset's card gives none.
DEFAULT_FPS = 30.0
_MIME = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}


@dataclass
class PageSummary:
    """What a page holds.

    Attributes:
        path: The file written (``None``: the bytes were returned).
        nbytes: The page's size.
        frame_bytes: The size of the frames it embeds, as stored (or as encoded for the page).
        episodes: The dataset's episodes it shows (positions).
        steps: Their steps, together.
        cameras: The camera keys shown.
        encoded: Camera keys stored raw, encoded for the page.
        audited: Whether the audit's flags and marks are in it.
        notes: What the page leaves out (keys too wide to draw, cameras it cannot show).
    """

    path: Path | None
    nbytes: int = 0
    frame_bytes: int = 0
    episodes: list[int] = field(default_factory=list)
    steps: int = 0
    cameras: list[str] = field(default_factory=list)
    encoded: list[str] = field(default_factory=list)
    audited: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass
class Camera:
    """A camera shown: its key, its frames' format on the page, and whether they are the stored
    image files (else encoded here)."""

    key: str
    fmt: FrameFormat  # the stored format, or the one encoded to
    stored: bool

    @property
    def mime(self) -> str:
        return _MIME[self.fmt.codec]


def write_episode_page(
    dataset: str | Dataset,
    out: str | os.PathLike[str],
    *,
    episodes: Sequence[int] = (0,),
    audit_flags: bool = True,
    tolerances: AuditTolerances | None = None,
    fps: float | None = None,
    root: str | os.PathLike[str] | CacheRoot | None = None,
) -> PageSummary:
    """Write the viewer page of ``episodes`` of ``dataset`` to ``out`` (replaced whole, or left
    as it was when anything fails).

    Args:
        dataset: A name in the cache, an alias, or an opened dataset (a zarr dataset read at a
            URL: ``rlds_cli.open_dataset(url)``).
        out: The HTML file to write (its folder must exist).
        episodes: The episodes shown (positions; negative ones count from the end).
        audit_flags: Audit the dataset (one bounded pass over it: see
            :func:`~rlds_cli.inspection.audit.audit`) and draw its flags and marks.
        tolerances: The audit's thresholds (default :class:`AuditTolerances`).
        fps: Playback rate in steps a second (default: the dataset card's ``fps``, else 30).
        root: Cache root, for a name.

    Returns:
        A :class:`PageSummary`.

    Raises:
        InvalidSelectionError: An episode outside the dataset, none, or too many.
        ViewerError: ``out``'s folder does not exist, or ``out`` is a folder, or a file there is
            no page an earlier run wrote (:func:`~rlds_cli._util.io.refuse_foreign_output`).
    """
    path = _output(out, "the page", ".html", root)
    refuse_foreign_output(path, "the page", PAGE_MARK, ViewerError)
    page = EpisodeContent(dataset, episodes, audit_flags, tolerances, fps, root)
    summary = PageSummary(path)
    atomic_write(path, lambda fh: page.write(fh, summary))
    return summary


def _output(out: str | os.PathLike[str], what: str, suffix: str, root: Any) -> Path:
    """``out`` as a file :func:`write_episode_page` or :func:`write_rerun` may write ``what`` to: a file
    (or none) in an existing folder it may write in, outside the cache's own folders at ``root``.

    Raises:
        ViewerError: It is not (named, with what to do).
    """
    path = Path(out)
    elsewhere = f"write {what} elsewhere"
    if path.is_dir():
        problem, hint = "it is a folder", f"name a {suffix} file"
    elif path.parent.is_file():
        problem, hint = f"{path.parent} is a file, not a folder", elsewhere
    elif not path.parent.is_dir():
        problem, hint = f"its folder {path.parent} does not exist", f"create the folder first, or {elsewhere}"
    elif not os.access(path.parent, os.W_OK | os.X_OK):  # rerun's own error named a temporary file
        problem, hint = f"permission denied in {path.parent}", elsewhere
    else:
        problem = hint = ""
    if problem:
        raise ViewerError(f"cannot write {what} to {path}: {problem}", hint=hint)
    refuse_cache_output(path, root, what, ViewerError)
    return path


def episode_page(
    dataset: str | Dataset,
    *,
    episodes: Sequence[int] = (0,),
    audit_flags: bool = True,
    tolerances: AuditTolerances | None = None,
    fps: float | None = None,
    root: str | os.PathLike[str] | CacheRoot | None = None,
) -> bytes:
    """The viewer page of :func:`write_episode_page` as bytes (held whole in memory: for short
    episodes)."""
    page = EpisodeContent(dataset, episodes, audit_flags, tolerances, fps, root)
    buffer = io.BytesIO()
    page.write(buffer, PageSummary(None))
    return buffer.getvalue()


class EpisodeContent:
    """What the page and the rerun recording show of some episodes of one dataset. Checks its
    arguments and audits when made; :meth:`episode` gives an episode's series, marks and
    statistics, :meth:`frames` its cameras' image files, :meth:`write` the page."""

    def __init__(
        self,
        dataset: str | Dataset,
        episodes: Sequence[int],
        audit_flags: bool,
        tolerances: AuditTolerances | None,
        fps: float | None,
        root: str | os.PathLike[str] | CacheRoot | None,
    ) -> None:
        if isinstance(dataset, str) and is_url(dataset):
            raise InvalidSelectionError(
                f"{dataset}: open a URL with rlds_cli.open_dataset(url) and pass the dataset",
                hint="or run 'rlds show URL'",
            )
        ds = dataset if isinstance(dataset, Dataset) else open_dataset(resolve_name(dataset, root), root)
        self.ds = ds
        self.positions = _positions(ds, episodes)
        if fps is not None and not (math.isfinite(fps) and fps > 0):
            raise InvalidSelectionError(
                f"fps must be a finite number above 0, got {fps}", hint="e.g. --fps 30"
            )
        self.fps = float(fps) if fps is not None else dataset_fps(ds) or DEFAULT_FPS
        self.roles = KeyRoles.of(ds)
        self.notes: list[str] = []
        self.cameras = self._cameras()
        self.tolerances = tolerances or AuditTolerances()
        self.report: AuditReport | None = audit(ds, tolerances=self.tolerances) if audit_flags else None

    def _cameras(self) -> list[Camera]:
        cameras = []
        for key in self.roles.images:
            spec = self.ds.stored_fields[key]
            fmt = spec.frame_format
            if fmt is not None:
                cameras.append(Camera(key, fmt, _stored_frames(self.ds.column(key)) is not None))
                continue
            shape = tuple(spec.shape)
            # (C, H, W) where the last side is no channel count and the first is
            first = len(shape) == 3 and shape[2] not in (1, 3, 4) and shape[0] in (1, 3, 4)
            channels = shape[0] if first else shape[-1] if len(shape) == 3 else 1
            codec = "png" if channels == 4 else "jpeg"
            if frame_shape_problem(shape, first, codec) is not None:
                self.notes.append(
                    f"{key} ({'x'.join(map(str, shape))} uint8) is not shown: not an image shape."
                )
                continue
            cameras.append(Camera(key, FrameFormat(codec, shape, channels_first=first), False))
        return cameras

    def write(self, fh: IO[bytes], summary: PageSummary) -> None:
        """Write the page to ``fh``, filling in ``summary``."""
        start = fh.tell()
        ds = self.ds
        episodes = [self.episode(int(i)) for i in self.positions]
        data = {
            "title": f"{ds.name}",
            "fps": self.fps,
            "chunk": FRAMES_PER_CHUNK,
            "audited": self.report is not None,
            "cameras": [
                {"key": c.key, "mime": c.mime, "width": int(c.fmt.image_shape[1])} for c in self.cameras
            ],
            "episodes": episodes,
            "notes": self.notes,
        }
        head, script, tail = _page_parts()
        fh.write(head.replace("{title}", html.escape(f"rlds show: {ds.name}")).encode())
        fh.write(b'<script type="application/json" id="rlds-data">')
        # "</" never appears inside the element: a key or a note cannot end it early
        fh.write(json.dumps(data, allow_nan=False, separators=(",", ":")).replace("</", "<\\/").encode())
        fh.write(b"</script>\n")
        fh.write(script.encode())
        for e, pos in enumerate(self.positions.tolist()):
            for k, blocks in enumerate(zip(*(self.frames(c, pos) for c in self.cameras), strict=True)):
                for c, encoded in enumerate(blocks):
                    texts = [base64.b64encode(f) for f in encoded]
                    summary.frame_bytes += sum(len(f) for f in encoded)
                    lens = ",".join(str(len(t)) for t in texts)
                    fh.write(f'<script type="text/plain" id="f{e}-{c}-{k}" data-n="{lens}">'.encode())
                    fh.writelines(texts)
                    fh.write(b"</script>\n")
        fh.write(tail.encode())
        summary.nbytes = fh.tell() - start
        summary.episodes = self.positions.tolist()
        summary.steps = int(sum(e["length"] for e in episodes))
        summary.cameras = [c.key for c in self.cameras]
        summary.encoded = [c.key for c in self.cameras if not c.stored]
        summary.audited = self.report is not None
        summary.notes = list(self.notes)

    # ------------------------------------------------------------------ one episode's data

    def _rows(self, pos: int, key: str) -> tuple[int, int]:
        """The stored rows ``[lo, hi)`` of episode ``pos``'s steps in column ``key`` (a flat
        key's final observation left out)."""
        index = self.ds.episode_index
        start, length = int(index["start"][pos]), int(index["length"][pos])
        lo = start + (pos if self.ds.stored_fields[key].storage == "flat" else 0)
        return lo, lo + length

    def episode(self, pos: int) -> dict[str, Any]:
        """Episode ``pos``'s data as the page holds it: ``index``, ``length``, ``plots`` (per
        key its ``dims``, lists with ``None`` where not finite), ``marks`` (kind, label, step
        ranges), ``flags`` and ``stats`` (label, text)."""
        ds, roles = self.ds, self.roles
        length = int(ds.episode_index["length"][pos])
        values: dict[str, np.ndarray] = {}
        for key in roles.low_dim:
            if np.dtype(ds.stored_fields[key].dtype).kind not in "biuf":
                continue
            lo, hi = self._rows(pos, key)
            values[key] = np.asarray(ds.column(key)[lo:hi]).reshape(length, -1)
        plots = []
        for key in sorted(values, key=_plot_order):
            v = values[key]
            if v.shape[1] > MAX_PLOT_DIMS:
                note = f"{key}: only its first {MAX_PLOT_DIMS} of {v.shape[1]} dimensions are drawn."
                if note not in self.notes:
                    self.notes.append(note)
            dims = v[:, :MAX_PLOT_DIMS].astype(np.float64).T
            plots.append({"key": key, "title": key, "dims": [_numbers(d) for d in dims]})
        marks = self._marks(pos, values, length)
        flags = self.report.episode_flags(pos) if self.report is not None else []
        return {
            "index": pos,
            "length": length,
            "plots": plots,
            "marks": marks,
            "flags": flags,
            "stats": self._stats(pos, values, length, flags),
        }

    def _marks(self, pos: int, values: dict[str, np.ndarray], length: int) -> list[dict[str, Any]]:
        """The timeline's rows: each a kind, a label and the step ranges it marks."""
        roles, t = self.roles, self.tolerances
        marks = []
        moving = [values[k] for k in (*roles.action, *roles.state) if k in values]
        idle = np.zeros(length, bool)
        if moving and length > 1:
            idle[1:] = np.all([_close(v, t.atol) for v in moving], axis=0)
            marks.append(_mark("idle", "idle (action and state unchanged)", idle))
        if self.report is not None and roles.action and length > 1:
            m = self.report.measures
            ok = m.lengths >= 2
            scale = np.median(m.rms_action_change[ok], axis=0) if ok.any() else np.zeros(0)
            actions = np.concatenate(
                [values[k].astype(np.float64) for k in roles.action if k in values], axis=1
            )
            if scale.size == actions.shape[1] and (scale > 0).any():
                jump = np.zeros(length, bool)
                with np.errstate(invalid="ignore"):
                    change = np.abs(np.diff(actions, axis=0))[:, scale > 0] / scale[scale > 0]
                    jump[1:] = (change > t.spike_factor).any(axis=1)
                marks.append(_mark("spike", f"action spike (> {t.spike_factor:g}x its typical change)", jump))
        for cam in self.cameras:
            same = self._same_frames(cam, pos, length) & ~idle
            marks.append(_mark("frozen", f"frozen {cam.key} (frame repeated while moving)", same))
        numbers = [values[k] for k in self.roles.numbers if k in values]
        if numbers:
            bad = np.any([~np.isfinite(v).all(axis=1) for v in numbers], axis=0)
            marks.append(_mark("nonfinite", "NaN/inf", bad))
        end = np.zeros(length, bool)
        for key in ("next/terminated", "next/truncated"):
            if key in values:
                end |= values[key].astype(bool).any(axis=1)
        marks.append(_mark("end", "terminated/truncated", end))
        return [m for m in marks if m["ranges"] or m["kind"] in ("idle", "end")]

    def _same_frames(self, cam: Camera, pos: int, length: int) -> np.ndarray:
        """Per step, whether the camera's frame is byte for byte the step before's (stored
        frames compared undecoded)."""
        same = np.zeros(length, bool)
        lo, hi = self._rows(pos, cam.key)
        column = self.ds.column(cam.key)
        stored = _stored_frames(column) if cam.stored else None
        if stored is not None:  # a block at a time: memory stays one block's
            for a in range(lo + 1, hi, FRAMES_PER_CHUNK):
                b = min(hi, a + FRAMES_PER_CHUNK)
                same[a - lo : b - lo] = stored.repeats(np.arange(a, b))
                stored.release(a - 1, b)
            return same
        for a in range(lo, hi, FRAMES_PER_CHUNK):  # with the row before, so runs cross blocks
            rows = np.asarray(column[max(lo, a - 1) : min(hi, a + FRAMES_PER_CHUNK)])
            flat = rows.reshape(len(rows), -1)
            eq = np.all(flat[1:] == flat[:-1], axis=1)
            same[a - lo + (0 if a > lo else 1) : a - lo + (0 if a > lo else 1) + len(eq)] = eq
        return same

    def _stats(
        self, pos: int, values: dict[str, np.ndarray], length: int, flags: list[str]
    ) -> list[list[str]]:
        rows = [["episode", str(pos)], ["steps", f"{length:,}"], ["duration", f"{length / self.fps:.1f} s"]]
        if "next/reward" in values:
            rows.append(["return", _fmt(float(np.sum(values["next/reward"], dtype=np.float64)))])
        if self.report is not None:
            e = self.report.episode(pos)
            rows.append(["idle", f"{e['idle_fraction']:.1%}"])
            rows.append(["spike score", _fmt(e["spike_score"])])
            rows.append(["jerk score", _fmt(e["jerk_score"])])
            if e["duplicate_of"] is not None:
                rows.append(["duplicate of", str(e["duplicate_of"])])
            rows.append(["audit flags", ", ".join(flags) or "none"])
        for key in self.roles.action:
            if key in values and len(values[key]):
                v = values[key].astype(np.float64)
                with warnings.catch_warnings():  # an all-NaN dimension shows "nan" in the table
                    warnings.simplefilter("ignore", RuntimeWarning)
                    rows.append([f"{key} mean", ", ".join(_fmt(x) for x in np.nanmean(v, axis=0)[:8])])
                    lows, highs = np.nanmin(v, axis=0)[:8], np.nanmax(v, axis=0)[:8]
                    ranges = (f"{_fmt(a)}..{_fmt(b)}" for a, b in zip(lows, highs, strict=True))
                    rows.append([f"{key} min..max", ", ".join(ranges)])
        return rows

    # ------------------------------------------------------------------ frames

    def frames(self, cam: Camera, pos: int) -> Iterator[list[bytes]]:
        """Episode ``pos``'s frames of ``cam``, :data:`FRAMES_PER_CHUNK` at a time, as the image
        files the page embeds."""
        lo, hi = self._rows(pos, cam.key)
        column = self.ds.column(cam.key)
        stored = _stored_frames(column) if cam.stored else None
        for a in range(lo, hi, FRAMES_PER_CHUNK):
            b = min(hi, a + FRAMES_PER_CHUNK)
            if stored is not None:  # one read of the block's bytes, cut at the frames' ends
                first, last = int(stored.starts[a]), int(stored.ends[b - 1])
                data = bytes(stored.fetch([first], [last])(0))
                stored.release(a, b)  # else 1.2 GB resident after a 10-minute episode's 3 cameras
                cuts = (stored.ends[a:b] - first).tolist()
                files = [data[s:e] for s, e in zip([0, *cuts[:-1]], cuts, strict=True)]
                for row, image in enumerate(files, a):  # what the loader would refuse is not shown
                    try:
                        check_frame(image, cam.fmt)
                    except FrameError as exc:
                        raise stored.damaged(row, exc.message) from None
                yield files
            else:
                rows = np.asarray(column[a:b], np.uint8)
                try:
                    yield encode_many(rows, cam.fmt, RAW_JPEG_QUALITY)
                except FrameError as exc:
                    raise ViewerError(
                        f"{cam.key} of {self.ds.name!r} cannot be shown: {exc.message}"
                    ) from None


def _stored_frames(column: Any) -> FramesColumn | None:
    """``column`` when it is a stored frame column whose image files can be read directly (a
    remote one included), else ``None`` (a view's or a merge's frames: decoded and re-encoded
    for the page)."""
    return column if isinstance(column, FramesColumn) else None


def _positions(ds: Dataset, episodes: Sequence[int]) -> np.ndarray:
    wanted = [int(i) for i in episodes]
    n = ds.num_episodes
    if n == 0:
        raise InvalidSelectionError(
            f"dataset {ds.name!r} holds no episode yet: nothing to show", hint="show it once it has one"
        )
    if not wanted:
        raise InvalidSelectionError(f"no episode of {ds.name!r} to show", hint="pass --episode I")
    if len(wanted) > MAX_EPISODES:
        raise InvalidSelectionError(
            f"{len(wanted)} episodes asked for; one page shows at most {MAX_EPISODES}",
            hint="write several pages",
        )
    for i in wanted:
        if not -n <= i < n:
            raise InvalidSelectionError(
                f"episode {i} is outside dataset {ds.name!r} ({n:,} episodes: 0 to {n - 1})",
                hint=f"pick an episode from 0 to {n - 1}",
            )
    return np.array([i % n for i in wanted], np.int64)


def _plot_order(key: str) -> tuple[int, str]:
    """Actions first, then observations, rewards, the end flags, and the rest."""
    if key == "action" or key.startswith("action/"):
        return 0, key
    if key == "next/reward":
        return 2, key
    if key in ("next/terminated", "next/truncated"):
        return 3, key
    return (4 if key.startswith(("info/", "next/")) else 1), key


def _close(v: np.ndarray, atol: float) -> np.ndarray:
    """Per step from 1, whether row ``t`` is within ``atol`` of row ``t - 1`` (the audit's rule)."""
    if v.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            return np.all(np.abs(np.diff(v, axis=0)) <= atol, axis=1)
    return np.all(v[1:] == v[:-1], axis=1)


def _mark(kind: str, label: str, steps: np.ndarray) -> dict[str, Any]:
    """The runs of ``steps`` as ``[start, stop)`` ranges."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], steps.astype(np.int8), [0]])))
    return {"kind": kind, "label": label, "ranges": edges.reshape(-1, 2).tolist()}


def _numbers(d: np.ndarray) -> list[float | None]:
    """A series for the page's data: 6 significant digits, ``None`` where not finite."""
    out: list[float | None] = [float(f"{x:.6g}") for x in d.tolist()]
    bad = np.flatnonzero(~np.isfinite(d))
    for i in bad.tolist():
        out[i] = None
    return out


def _fmt(x: float | None) -> str:
    return "nan" if x is None or not math.isfinite(x) else f"{x:.4g}"


@dataclass
class RerunSummary:
    """What a recording holds: the file, its size, the episodes, their steps and cameras."""

    path: Path
    nbytes: int = 0
    episodes: list[int] = field(default_factory=list)
    steps: int = 0
    cameras: list[str] = field(default_factory=list)


def write_rerun(
    dataset: str | Dataset,
    out: str | os.PathLike[str],
    *,
    episodes: list[int] | tuple[int, ...] = (0,),
    audit_flags: bool = True,
    tolerances: AuditTolerances | None = None,
    fps: float | None = None,
    root: str | os.PathLike[str] | CacheRoot | None = None,
) -> RerunSummary:
    """Write ``episodes`` of ``dataset`` as a rerun recording ``out`` (``.rrd``); the arguments
    are :func:`~rlds_cli.inspection.viewer.write_episode_page`'s.

    Raises:
        MissingExtraError: rerun-sdk is not installed (``pip install 'rlds-cli[rerun]'``).
        InvalidSelectionError, ViewerError: As for the page.
    """
    rr = import_extra("rerun", "--rerun", hint="pip install 'rlds-cli[rerun]'", package="rerun-sdk")
    path = _output(out, "the recording", ".rrd", root)
    refuse_foreign_output(path, "the recording", b"rlds", ViewerError, magic=b"RRF")  # rerun's, by "rlds"
    content = EpisodeContent(dataset, episodes, audit_flags, tolerances, fps, root)
    summary = RerunSummary(path, cameras=[c.key for c in content.cameras])
    with atomic_path(path) as tmp:
        rec = rr.RecordingStream("rlds", send_properties=False)
        rec.save(tmp)
        rec.send_recording_name(content.ds.name)
        for pos in content.positions.tolist():
            summary.steps += _episode(rr, rec, content, pos)
            summary.episodes.append(pos)
        rec.flush()
        rec.disconnect()
        summary.nbytes = tmp.stat().st_size
    return summary


def _episode(rr: Any, rec: Any, content: EpisodeContent, pos: int) -> int:
    """Send episode ``pos``; returns its steps."""
    data = content.episode(pos)
    n = data["length"]
    base = f"episode/{pos}"
    steps = np.arange(n, dtype=np.int64)

    def times(a: int, b: int) -> list[Any]:
        return [
            rr.TimeColumn("step", sequence=steps[a:b]),
            rr.TimeColumn("time", duration=steps[a:b] / content.fps),
        ]

    for plot in data["plots"]:
        for d, values in enumerate(plot["dims"]):
            column = np.array([np.nan if v is None else v for v in values], np.float64)
            rec.send_columns(
                f"{base}/{plot['key']}/{d}", indexes=times(0, n), columns=rr.Scalars.columns(scalars=column)
            )
    for cam in content.cameras:
        a = 0
        for block in content.frames(cam, pos):
            b = a + len(block)
            columns = rr.EncodedImage.columns(blob=block, media_type=[cam.mime] * len(block))
            rec.send_columns(f"{base}/{cam.key}", indexes=times(a, b), columns=columns)
            a = b
    for mark in data["marks"]:
        for start, stop in mark["ranges"]:
            rec.set_time("step", sequence=start)
            rec.log(
                f"{base}/audit", rr.TextLog(f"{mark['label']}: steps {start} to {stop - 1}", level="WARN")
            )
    flags = ", ".join(data["flags"]) or "none"
    table = "\n".join(f"* **{k}**: {v}" for k, v in data["stats"])
    doc = f"# episode {pos}\n\naudit flags: {flags}\n\n{table}\n"
    rec.log(f"{base}/stats", rr.TextDocument(doc, media_type="text/markdown"), static=True)
    return int(n)


@functools.cache
def _page_parts() -> tuple[str, str, str]:
    """The page's fixed text before the data, between the data and the frames, and after them."""
    page = (importlib.resources.files("rlds_cli") / "data" / "viewer.html").read_text("utf-8")
    head, rest = page.split("<!-- rlds:data -->\n")
    script, tail = rest.split("<!-- rlds:frames -->\n")
    return head, script, tail
