"""LeRobot video frames matched to parquet rows: each camera's mp4 decoded forward with PyAV, one
frame held at a time; row ``t`` gets the frame within :data:`TIMESTAMP_TOLERANCE_S` of
``from_timestamp + timestamp[t]`` (lerobot's rule), as uint8 RGB (``gray``: one channel), HWC or CHW."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.lerobot.layout import INFO_FILE, Feature

#: lerobot's ``tolerance_s`` default: how far a frame's time may be from the row's timestamp.
TIMESTAMP_TOLERANCE_S = 1e-4


class VideoCursor:
    """Decodes one camera's mp4 forward, one frame held at a time, and hands out the frames
    whose times match the rows' timestamps."""

    def __init__(self, av: Any, feature: Feature) -> None:
        self.av = av
        self.feature = feature
        self.path: Path | None = None
        self.container: Any = None
        self.decoder: Iterator[Any] | None = None
        self.current: Any = None
        self.current_time = -np.inf
        self.time_base: Any = None
        channels = feature.shape[0] if feature.channels_first else feature.shape[-1]
        formats = {1: "gray", 3: "rgb24", 4: "rgba"}
        if channels not in formats:
            raise SourceFormatError(
                f"video feature {feature.name!r} has {channels} channels; rlds decodes 1, 3 or 4"
            )
        self.pixel_format = formats[channels]
        # one converter for every frame: frame.to_ndarray(format=...) builds a swscale context per
        # frame, several times slower for bit-identical output
        self.reformatter = av.video.reformatter.VideoReformatter()

    def close(self) -> None:
        if self.container is not None:
            self.container.close()
        self.container = self.decoder = self.current = self.path = None

    def _open(self, path: Path) -> None:
        self.close()
        try:
            self.container = self.av.open(str(path))
            streams = self.container.streams.video
            if not streams:
                raise SourceFormatError(f"{path} has no video stream")
            stream = streams[0]
            stream.thread_type = "AUTO"  # frame threads: decoding, not our Python, is the cost
            height, width = stream.codec_context.height, stream.codec_context.width
            shape = self.feature.shape
            want = (shape[1], shape[2]) if self.feature.channels_first else (shape[0], shape[1])
            if (height, width) != want:
                raise SourceFormatError(
                    f"{path}: frames are {height}x{width}, but {INFO_FILE.as_posix()} declares "
                    f"{list(shape)} for {self.feature.name!r}"
                )
            self.time_base = stream.time_base
            self.decoder = iter(self.container.decode(stream))
        except self.av.error.FFmpegError as exc:
            self.close()
            raise SourceFormatError(f"{path} is not a readable video: {exc}") from None
        self.path, self.current, self.current_time = path, None, -np.inf
        self._advance()

    def _advance(self) -> None:
        assert self.decoder is not None
        try:
            frame = next(self.decoder)
        except StopIteration:
            self.current, self.current_time = None, np.inf
            return
        except self.av.error.FFmpegError as exc:
            raise SourceFormatError(f"{self.path} is damaged (decoding failed): {exc}") from None
        if frame.pts is None:
            raise SourceFormatError(f"{self.path}: a frame has no timestamp")
        self.current, self.current_time = frame, float(frame.pts * self.time_base)

    def _array(self) -> np.ndarray:
        image = self.reformatter.reformat(self.current, format=self.pixel_format).to_ndarray()
        if image.ndim == 2:
            image = image[:, :, None]
        if self.feature.channels_first:
            image = image.transpose(2, 0, 1)
        return np.ascontiguousarray(image, dtype=np.uint8)

    def frames(
        self, path: Path, times: np.ndarray, episode: int, start: float, stop: float, length: int
    ) -> np.ndarray:
        """The frames at ``times`` (seconds in the file), as ``[len(times), *shape]`` uint8."""
        tol = TIMESTAMP_TOLERANCE_S
        if path != self.path or (len(times) and times[0] < self.current_time - tol):
            self._open(path)
        out = np.empty((len(times), *self.feature.shape), np.uint8)
        for i, t in enumerate(times):
            # parquet timestamps are float32: allow their rounding on top of lerobot's tolerance
            slack = tol + 2 * float(np.spacing(np.float32(t)))
            while self.current is not None and self.current_time < t - slack:
                self._advance()
            if self.current is None or self.current_time > t + slack:
                raise self._missing(path, float(t), episode, start, stop, length)
            out[i] = self._array()
        return out

    def _missing(
        self, path: Path, t: float, episode: int, start: float, stop: float, length: int
    ) -> SourceFormatError:
        """The error for a row without its frame: count the episode's frames (packets, no decoding)."""
        found = 0
        try:
            with self.av.open(str(path)) as container:
                stream = container.streams.video[0]
                for packet in container.demux(stream):
                    if packet.pts is None:
                        continue
                    when = float(packet.pts * stream.time_base)
                    if start - TIMESTAMP_TOLERANCE_S <= when < stop - TIMESTAMP_TOLERANCE_S:
                        found += 1
        except self.av.error.FFmpegError:
            pass
        if found < length:
            return SourceFormatError(
                f"{path}: episode {episode} has {found} frames between {start:.3f} s and {stop:.3f} s, "
                f"but the parquet has {length} rows for it (no frame at {t:.4f} s)"
            )
        return SourceFormatError(
            f"{path}: episode {episode} has no frame within {TIMESTAMP_TOLERANCE_S} s of {t:.4f} s "
            "(the video's frame times do not match the parquet's timestamps)"
        )
