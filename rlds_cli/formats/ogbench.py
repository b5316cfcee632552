"""OGBench ``.npz`` files (train ``<name>.npz`` and validation ``<name>-val.npz``), streamed.

An OGBench file concatenates trajectories row by row: ``observations``, ``actions``,
``terminals`` (set on each trajectory's last row), ``qpos``, ``qvel`` and sometimes
``button_states``; no rewards, no next observations. Rules (``docs/formats.md``):

* A trajectory of ``L`` rows is ``L - 1`` transitions: step ``t`` is
  ``(observations[t], actions[t]) -> observations[t + 1]``; the last row is the final
  observation and its action is not stored (as OGBench's ``load_dataset`` drops it); counted in
  ``conversion.dropped_rows``.
* ``terminals`` marks where a trajectory ends, not why (OGBench sets it for ``terminated or
  truncated``; its collection episodes end by the time limit), so every episode ends
  **truncated**. A one-row trajectory has no transition and is dropped.
* The file's last row always ends a trajectory.
* **Rewards**: none in the files (goal-conditioned; rewards come from relabelling).
  ``next/reward`` is all zeros, noted in the manifest, unless the file has a ``rewards`` array
  (relabelled single-task data), used row for row.
* Every other per-row array (``qpos``, ``qvel``, ``button_states``...) is observation-like:
  stored once as ``info/<key>``, read back at t and t + 1.
* Several files (train and ``-val``) are converted one after the other, never joining a
  trajectory across files; each episode's file is in ``source_metadata.npz``
  (``ogbench/episode_file``). Usually each split is converted into its own dataset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import (
    ConversionReport,
    Reader,
    ReaderOptions,
    StepBlock,
    clean_keys,
    is_text,
    renamed_note,
    rows_per_block,
    text_note,
)
from rlds_cli.formats.base import column as _column
from rlds_cli.formats.folders import folder_files
from rlds_cli.formats.npz_util import NpyStream, npz_keys, npz_names, open_npz
from rlds_cli.formats.untrusted import require_numeric, require_rows

REQUIRED_KEYS = ("observations", "actions", "terminals")


def sniff(path: Path) -> bool:
    """Whether ``path`` is an OGBench file: an ``.npz`` with ``observations`` and ``terminals``
    (asked after AMAGO and D4RL, whose ``.npz`` layouts have them too)."""
    return {"observations", "terminals"} <= set(npz_names(path) or ())


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The ``.npz`` files of an OGBench source (train before ``-val`` in a directory)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = folder_files(p, lambda q: q.name.endswith(".npz"))  # hidden, .tmp: not read
            out += sorted(found, key=lambda q: (q.stem.endswith("-val"), q))
        else:
            out.append(p)
    return out


class _File:
    """The streams of one OGBench file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zf = open_npz(path)
        keys = npz_keys(self.zf)
        missing = [k for k in REQUIRED_KEYS if k not in keys]
        if missing:
            self.zf.close()
            raise SourceFormatError(
                f"{path} has no {missing[0]!r} array; an OGBench file needs {', '.join(REQUIRED_KEYS)} "
                f"(found: {', '.join(sorted(keys)) or 'nothing'})"
            )
        self.streams: dict[str, NpyStream] = {}
        try:
            for k in sorted(keys):
                self.streams[k] = NpyStream(self.zf, k, path)
            self._check()
        except BaseException:
            self.close()
            raise

    def _check(self) -> None:
        path = self.path
        # untrusted input: the step arrays have a row axis and hold numbers (or bools)
        for key in (*REQUIRED_KEYS, "rewards"):
            if key in self.streams:
                require_rows(path, key, self.streams[key].shape)
                require_numeric(path, key, self.streams[key].dtype)
        self.n = self.streams["observations"].shape[0]
        for key, s in self.streams.items():
            if not s.shape or s.shape[0] != self.n:
                raise SourceFormatError(
                    f"{path}: {key!r} has {s.shape[0] if s.shape else 0} rows but 'observations' has "
                    f"{self.n} (ragged arrays)"
                )
        if self.n == 0:
            raise SourceFormatError(f"{path}: 'observations' is empty")
        if self.streams["terminals"].shape[1:] not in ((), (1,)):
            raise SourceFormatError(f"{path}: 'terminals' must have one value per row")

    def close(self) -> None:
        for s in self.streams.values():
            s.close()
        self.zf.close()


@dataclass(frozen=True)
class OGBenchOptions(ReaderOptions):
    """Options of :class:`OGBenchReader` (its keyword arguments)."""

    block_rows: int | None = None


class OGBenchReader(Reader):
    """Streams OGBench ``.npz`` files as :class:`StepBlock` s.

    Args:
        path: An ``.npz`` file, a directory of them, or a list of files.
        block_rows: Rows per block (default: about 8 MiB of source data).
    """

    format_name = "ogbench"
    expected_files = ".npz files with observations, actions and terminals"
    Options = OGBenchOptions
    sniff = staticmethod(sniff)
    source_files = staticmethod(source_files)

    def __init__(self, path: str | Path | Sequence[str | Path], *, block_rows: int | None = None) -> None:
        paths = [Path(p) for p in ([path] if isinstance(path, str | Path) else path)]
        self.path = paths[0]
        self.files = source_files(paths)
        self.block_rows = block_rows
        self.report = ConversionReport(rules="ogbench-v1")
        self._total = 0
        self._schema: dict[str, tuple[tuple[int, ...], str]] | None = None
        for f in self.files:  # check every file before writing anything
            opened = _File(f)
            try:
                self._check_schema(opened)
                self._total += opened.n
                self._has_rewards = "rewards" in opened.streams
            finally:
                opened.close()
        self.report.source_rows = self._total
        self._episode_file: list[np.ndarray] = []
        self._plan_info_keys()
        if not self._has_rewards:
            self.report.notes.append(
                "OGBench files carry no rewards: next/reward is all zeros (relabel for your task)"
            )
        self.report.notes.append(
            "OGBench 'terminals' mark trajectory ends (terminated or truncated): every episode ends truncated"
        )

    def _plan_info_keys(self) -> None:
        """Array name -> TED key of the extra per-row arrays (``info/<name>``); text arrays are dropped
        with a note."""
        assert self._schema is not None
        wanted: dict[str, tuple[str, ...]] = {}
        for key, (_, dtype) in sorted(self._schema.items()):
            if key in ("terminals", "actions", "observations", "rewards"):
                continue
            if is_text(np.dtype(dtype)):
                self.report.notes.append(text_note(key, np.dtype(dtype)))
            else:
                require_numeric(self._first, key, np.dtype(dtype))
                wanted[key] = ("info", *key.split("/"))
        cleaned = clean_keys(wanted)
        self._info_keys = {k: cleaned[k] for k in wanted}
        renamed = renamed_note(cleaned, wanted)
        if renamed:
            self.report.notes.append(renamed)

    def _check_schema(self, f: _File) -> None:
        schema = {k: (s.shape[1:], s.dtype.str) for k, s in f.streams.items()}
        if self._schema is None:
            self._schema, self._first = schema, f.path
        elif schema != self._schema:
            diff = sorted(k for k in set(schema) | set(self._schema) if schema.get(k) != self._schema.get(k))
            raise SourceFormatError(
                f"{f.path}: arrays {diff} differ in presence, shape or dtype from {self._first} (mixed files)"
            )

    def total_rows(self) -> int:
        return self._total

    def source_metadata(self) -> dict[str, Any]:
        return {"ogbench": {"files": [f.name for f in self.files]}}

    def source_arrays(self) -> dict[str, np.ndarray]:
        if len(self.files) < 2:
            return {}
        return {
            "ogbench/episode_file": np.concatenate(self._episode_file) if self._episode_file else np.zeros(0)
        }

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield every file's trajectories, file by file."""
        for index, path in enumerate(self.files):
            f = _File(path)
            try:
                yield from self._file_blocks(f, index, progress)
            finally:
                f.close()

    def _file_blocks(
        self, f: _File, index: int, progress: Callable[[int], None] | None
    ) -> Iterator[StepBlock]:
        term_stream = f.streams["terminals"]
        terminals = term_stream.read(f.n).reshape(f.n) != 0
        is_end = terminals.copy()
        is_end[-1] = True  # the file's last row closes a trajectory
        row_bytes = sum(
            int(np.prod(s.shape[1:], dtype=np.int64)) * s.dtype.itemsize for s in f.streams.values()
        )
        block = self.block_rows or rows_per_block(row_bytes, 256, 1 << 18)
        others = list(self._info_keys)
        start = 0
        prev_end = True  # row -1 "ended", so row 0 starts a trajectory
        while start < f.n:
            stop = min(start + block, f.n)
            if stop < f.n and is_end[stop] and not is_end[stop - 1]:
                stop += 1  # keep a trajectory's end row with its last step
            rows = {k: f.streams[k].read(stop - start) for k in ("observations", "actions", *others)}
            if "rewards" in f.streams:
                rows["rewards"] = f.streams["rewards"].read(stop - start)
            end = is_end[start:stop]
            starts = np.concatenate([[prev_end], end[:-1]])
            orphan = end & starts  # a one-row trajectory: no transition
            step = ~end
            nxt_end = np.append(end[1:], False)
            last = step & nxt_end
            self.report.dropped_rows += int(end.sum())
            self.report.dropped_episodes += int(orphan.sum())
            prev_end = bool(end[-1])
            if progress is not None:
                progress(stop - start)
            n = int(step.sum())
            if n == 0:
                start = stop
                continue
            ends = np.flatnonzero(last[step])
            keep = ~orphan
            observations = {"observation": rows["observations"][keep]}
            for k in others:
                observations[self._info_keys[k]] = rows[k][keep]
            rewards = _column(rows["rewards"][step]) if "rewards" in rows else np.zeros((n, 1), np.float32)
            trunc = np.zeros((n, 1), bool)
            trunc[ends, 0] = True
            steps = {
                "action": rows["actions"][step],
                "next/reward": rewards,
                "next/terminated": np.zeros((n, 1), bool),
                "next/truncated": trunc,
            }
            self._episode_file.append(np.full(len(ends), index, np.int64))
            yield StepBlock(steps=steps, observations=observations, ends=ends)
            start = stop
