"""``rlds show --rerun FILE.rrd``: the viewer's episodes as a recording for the rerun viewer
(``rerun FILE.rrd``; the ``rerun`` extra: ``rerun-sdk``).

The recording holds what the HTML page shows (:class:`~rlds_cli.inspection.viewer.EpisodeContent`),
under ``episode/<I>/`` for each episode ``I``: each camera's frames at ``episode/<I>/<key>`` as
``EncodedImage`` (the stored JPEG/PNG/WebP files, as the page embeds them), every plotted
dimension at ``episode/<I>/<key>/<d>`` as ``Scalars``, both on the ``step`` timeline (and
``time``, at the page's fps), the audit's marks as ``TextLog`` entries where each range starts,
and the episode's statistics as a static ``TextDocument`` at ``episode/<I>/stats``. Frames are
sent a chunk (:data:`~rlds_cli.inspection.viewer.FRAMES_PER_CHUNK` frames) at a time; the file
is written beside ``out`` and renamed when whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli._util.io import atomic_path
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import MissingExtraError, ViewerError
from rlds_cli.inspection.audit import AuditTolerances
from rlds_cli.inspection.viewer import EpisodeContent

__all__ = ["RerunSummary", "write_rerun"]


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
    try:
        import rerun as rr
    except ImportError:
        raise MissingExtraError(
            "--rerun needs rerun-sdk, which is not installed", hint="pip install 'rlds-cli[rerun]'"
        ) from None
    path = Path(out)
    if path.is_dir() or not path.parent.is_dir():
        what = "it is a folder" if path.is_dir() else f"its folder {path.parent} does not exist"
        raise ViewerError(
            f"cannot write the recording to {path}: {what}", hint="name an .rrd file in a folder"
        )
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
