"""The V-D4RL reader: rows streamed into TED with the dataset's one-step action/reward shift applied
across chunks and files (:class:`Stitcher`).

Layouts and file order: :mod:`rlds_cli.formats.vd4rl.files`. Rules (``vd4rl-v1``;
``docs/formats.md``, "V-D4RL"):

* **The shift.** Both layouts follow the dm_env/Dreamer convention: row ``t`` holds the
  observation *after* action ``t``; ``action[t]`` and ``reward[t]`` led to ``obs[t]``. An episode
  of rows ``0..T`` is ``T`` TED transitions: ``observation = obs[t]``, ``action = action[t + 1]``,
  ``next/reward = reward[t + 1]``, ``next/observation = obs[t + 1]``. Row 0's action and reward
  (zero padding) are not stored; row ``T`` is the real final observation (``final_known = true``).
  TorchRL keeps them unshifted; rlds follows the dataset's own loader (drqbc pairs ``obs[i - 1]``
  with ``action[i]``, ``reward[i]``).
* **Episode ends.** The last step is **terminated** when the environment terminated on the last
  row (``is_terminal``, else ``discount == 0``), else **truncated** (DMC's 500-step limit: every
  V-D4RL episode). A terminal flag before an episode's last row is refused.
* **Dreamer files**: one episode per file, in name order. ``is_first`` must be set on row 0 only,
  ``is_last`` on the last row only; anything else is refused. The count in the file name is a
  label: ``rows - 1`` or ``rows`` is accepted, any other is a warning
  (:mod:`rlds_cli.formats.folders`).
* **drqbc shards**, in natural name order: an episode starts at ``step_type`` 0 (or after a 2)
  and ends at 2 (or before a 0). A shard ending without 2 whose successor starts without 0
  continues the episode; an episode ending without 2 (the last shard's end, a 0 not preceded by
  2) ends truncated there, and one starting without 0 loses its first row's action and reward:
  both counted and noted.
* **Keys.** Frames become ``observation`` (uint8, source layout unless ``image_layout`` is
  ``"hwc"`` or ``"chw"``). Other per-row arrays (proprioceptive state in some files) are
  observation-like too: then frames are ``observation/image`` and the others
  ``observation/<name>``. ``discount``, ``step_type`` and the flags are consumed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlds_cli.errors import SourceFormatError, SourceNotFoundError
from rlds_cli.formats.base import (
    BlockPacker,
    ConversionReport,
    Reader,
    ReaderOptions,
    StepBlock,
    clean_keys,
    column,
    from_layout,
    renamed_note,
    rows_per_block,
)
from rlds_cli.formats.folders import DREAMER_NAME, BadFiles
from rlds_cli.formats.vd4rl import files as layout
from rlds_cli.formats.vd4rl.files import HDF5_SUFFIXES, NPZ_FLAGS, NpzEpisode, Schema, Shard, source_files


@dataclass
class Chunk:
    """Consecutive source rows of one file, with where episodes start and end.

    ``start[r]``: row ``r`` begins an episode (its action and reward are not a transition's);
    ``end[r]``: row ``r`` is an episode's last (its observation is the final one);
    ``terminal[r]``: the environment terminated on row ``r``.
    """

    file: int
    obs: dict[str, np.ndarray]
    action: np.ndarray
    reward: np.ndarray
    start: np.ndarray
    end: np.ndarray
    terminal: np.ndarray


class Stitcher:
    """Turns chunks of rows into flat TED blocks, applying the shift: the step of row ``r`` (not an
    episode's first) is ``obs[r - 1]``, ``action[r]``, ``reward[r]``. One observation row is carried
    from chunk to chunk while an episode continues."""

    def __init__(self, pixel_key: str, transpose: tuple[int, ...] | None) -> None:
        self.pixel_key = pixel_key
        self.transpose = transpose
        self.carry: dict[str, np.ndarray] | None = None
        self.start_file = -1
        #: Per episode emitted, the file where it started.
        self.episode_file: list[np.ndarray] = []

    def feed(self, c: Chunk) -> StepBlock | None:
        step = ~c.start
        rows = np.flatnonzero(step)
        ends_rows = np.flatnonzero(c.end & step)
        off = 0 if self.carry is None else 1
        if step[0] and self.carry is None:  # the flags say an episode continues but nothing was read
            raise AssertionError("vd4rl: a chunk continues an episode without its previous observation")
        # files of the episodes ending here: this chunk's file once an episode started in it
        opened = np.flatnonzero(c.start & ~c.end)
        first_open = int(opened[0]) if len(opened) else len(c.start)
        files = np.where(ends_rows > first_open, c.file, self.start_file).astype(np.int64)
        if len(opened):
            self.start_file = c.file
        carry = self.carry
        self.carry = None if c.end[-1] else {k: v[-1:].copy() for k, v in c.obs.items()}
        if not len(rows):
            return None
        self.episode_file.append(files)
        ends = np.searchsorted(rows, ends_rows)
        # the flat rows: each step's observation (row r - 1), and after an episode's last step
        # its final observation (row e); offset by one when the carried row leads
        idx = np.insert(rows - 1 + off, ends + 1, ends_rows + off)
        observations = {k: self._gather(k, v, carry, idx) for k, v in c.obs.items()}
        n = len(rows)
        term = np.zeros((n, 1), bool)
        trunc = np.zeros((n, 1), bool)
        term[ends, 0] = c.terminal[ends_rows]
        trunc[ends, 0] = ~c.terminal[ends_rows]
        steps = {
            "action": c.action[rows],
            "next/reward": column(c.reward[rows]),
            "next/terminated": term,
            "next/truncated": trunc,
        }
        return StepBlock(steps=steps, observations=observations, ends=ends.astype(np.int64))

    def _gather(
        self, key: str, rows: np.ndarray, carry: dict[str, np.ndarray] | None, idx: np.ndarray
    ) -> np.ndarray:
        if carry is None and len(idx) == len(rows) and idx[0] == 0 and idx[-1] == len(rows) - 1:
            out = rows  # idx is strictly increasing: it is every row, in order (no copy)
        else:
            out = (rows if carry is None else np.concatenate([carry[key], rows]))[idx]
        if key == self.pixel_key and self.transpose is not None:
            out = np.ascontiguousarray(out.transpose(self.transpose))
        return out


RULES = "vd4rl-v1"
_MAX_CHUNK_ROWS = 1 << 16
IMAGE_LAYOUTS = ("hwc", "chw")
_SHIFT_NOTE = (
    "V-D4RL rows follow the dm_env convention (row t: the observation after action t): transition "
    "t pairs obs[t] with action[t+1] and reward[t+1] (TorchRL's VD4RLExperienceReplay does not "
    "shift); each episode's first-row action and reward (zero padding) are not stored"
)


@dataclass(frozen=True)
class VD4RLOptions(ReaderOptions):
    """Options of :class:`VD4RLReader` (its keyword arguments)."""

    image_layout: Literal["hwc", "chw"] | None = None
    block_rows: int | None = None
    skip_bad_files: bool = False


@from_layout(layout)  # sniff, source_files and EXPECTED_FILES: formats/vd4rl/files.py
class VD4RLReader(Reader):
    """Streams V-D4RL data (Dreamer ``.npz`` episodes or drqbc ``.hdf5`` shards) in TED layout.

    Args:
        path: A file, a folder of them, or a list of files (one layout per conversion).
        image_layout: ``None`` (default): frames stay as the source stores them (Dreamer HWC,
            drqbc CHW). ``"hwc"`` or ``"chw"``: transposed to that layout while streaming.
        block_rows: Source rows per read (default: about ``packing.BLOCK_BYTES``).
        skip_bad_files: Skip unreadable (half-written, corrupt) files, naming them in the
            conversion notes, instead of stopping at the first (:mod:`rlds_cli.formats.folders`).
    """

    format_name = "vd4rl"
    Options = VD4RLOptions

    def __init__(
        self,
        path: str | Path | Sequence[str | Path],
        *,
        image_layout: str | None = None,
        block_rows: int | None = None,
        skip_bad_files: bool = False,
    ) -> None:
        paths = [Path(p) for p in ([path] if isinstance(path, str | Path) else path)]
        for p in paths:
            if not p.exists():
                raise SourceNotFoundError(f"source {p} does not exist")
        self.path = paths[0]
        if image_layout is not None and str(image_layout).lower() not in IMAGE_LAYOUTS:
            raise SourceFormatError(
                f"image_layout is {image_layout!r}; the vd4rl format takes 'hwc', 'chw' or none "
                "(keep the source's layout)"
            )
        if block_rows is not None and (isinstance(block_rows, bool) or int(block_rows) < 1):
            raise SourceFormatError(f"block_rows is {block_rows!r}; it must be a positive integer")
        self.block_rows = None if block_rows is None else int(block_rows)
        self.files = source_files(paths)
        self.report = ConversionReport(rules=RULES)
        self.kind = self._kind()
        self._counts: dict[str, int] = {}
        self._note_at: dict[str, int] = {}
        self._prev_end = True  # the row before the first one "ended": the stream starts an episode
        self._bad = BadFiles(skip_bad_files)
        self._schema = self._plan()
        self.stored_layout = (image_layout or self._schema.layout).upper()
        self._transpose = self._transpose_for(self._schema.layout, self.stored_layout)
        self._plan_keys()
        self.report.notes.append(_SHIFT_NOTE)
        self._stitcher = Stitcher(self._keys[self._schema.pixel], self._transpose)

    # ------------------------------------------------------------------ planning

    def _kind(self) -> str:
        if not self.files:
            raise SourceFormatError(f"{self.path} holds no .npz or .hdf5 files")
        npz = [f for f in self.files if f.name.lower().endswith(".npz")]
        if npz and len(npz) < len(self.files):
            other = next(f for f in self.files if f not in npz)
            raise SourceFormatError(
                f"{self.path} holds both Dreamer .npz episodes ({npz[0].name}) and drqbc shards "
                f"({other.name}); the two layouts are two copies of a dataset at different sizes",
                hint="convert the folder of one layout (e.g. .../64px for the .npz, .../84px for the .hdf5)",
            )
        unknown = [f for f in self.files if not f.name.lower().endswith((".npz", *HDF5_SUFFIXES))]
        if unknown:
            raise SourceFormatError(
                f"{unknown[0]} is neither a Dreamer .npz episode nor a drqbc .hdf5 shard",
                hint="pass the .npz/.hdf5 files (or their folder) only",
            )
        return "npz" if npz else "hdf5"

    def _open(self, path: Path) -> NpzEpisode | Shard:
        return NpzEpisode(path) if self.kind == "npz" else Shard(path)

    def _plan(self) -> Schema:
        """Check every file's arrays (headers only) before anything is written."""
        schema: Schema | None = None
        self._rows: list[int] = []
        self._edges: list[tuple[int, int]] = []  # drqbc: each shard's first and last step_type
        kept: list[Path] = []
        for f in self.files:
            try:
                opened = self._open(f)
            except SourceFormatError as exc:  # unreadable: stop, or skip when the user asked
                self._bad.handle(f, exc)
                continue
            kept.append(f)
            try:
                mine = opened.schema(self.report)
                if schema is None:
                    schema = mine
                else:
                    diff = schema.same(mine)
                    if diff:
                        raise SourceFormatError(
                            f"{f}: arrays {diff} differ in presence, shape or dtype from {schema.first} "
                            "(files of different datasets?)"
                        )
                self._rows.append(opened.rows)
                note = getattr(opened, "name_note", None)
                if note:  # the CLI shows every note as a warning
                    self.report.notes.append(note)
                if isinstance(opened, Shard):
                    n = opened.rows
                    self._edges.append((int(opened.step_type(0, 1)[0]), int(opened.step_type(n - 1, n)[0])))
            finally:
                opened.close()
        self.files = kept
        skipped = self._bad.note()
        if skipped:
            self.report.notes.append(skipped)
        if schema is None:
            raise SourceFormatError(f"{self.path}: none of its {len(self._bad.skipped)} files is readable")
        self.report.source_rows = sum(self._rows)
        if self.kind == "npz" and all(DREAMER_NAME.match(f.name) for f in self.files):
            # Dreamer names declare each episode's rows: inspect --check compares
            self.report.expected = {
                "num_steps": sum(r - 1 for r in self._rows),
                "num_episodes": len(self.files),
            }
        return schema

    def _plan_keys(self) -> None:
        """Source array -> TED key: the frames are ``observation`` alone, or
        ``observation/image`` beside ``observation/<name>`` for other per-row arrays."""
        s = self._schema
        if not s.extras:
            self._keys = {s.pixel: "observation"}
            return
        wanted: dict[str, tuple[str, ...]] = {s.pixel: ("observation", "image")}
        for key in s.extras:
            wanted[key] = ("observation", *key.split("/"))
        cleaned = clean_keys(wanted)
        self._keys = {k: cleaned[k] for k in wanted}
        extras = {k: v for k, v in wanted.items() if k != s.pixel}  # the frames' key is chosen, not cleaned
        renamed = renamed_note({k: cleaned[k] for k in extras}, extras)
        if renamed:
            self.report.notes.append(renamed)

    @staticmethod
    def _transpose_for(source: str, stored: str) -> tuple[int, ...] | None:
        if source == stored:
            return None
        return (0, 3, 1, 2) if stored == "CHW" else (0, 2, 3, 1)

    # ------------------------------------------------------------------ protocol

    def total_rows(self) -> int:
        return self.report.source_rows

    def source_metadata(self) -> dict[str, Any]:
        s = self._schema
        return {
            "vd4rl": {
                "layout": "dreamer-npz" if self.kind == "npz" else "drqbc-hdf5",
                "image_key": self._keys[s.pixel],
                "source_image_layout": s.layout,
                "image_layout": self.stored_layout,
                "keys": {src: key for src, key in sorted(self._keys.items())},
            }
        }

    def source_arrays(self) -> dict[str, np.ndarray]:
        """``vd4rl/episode_file``: per episode, the index (into ``source.files``) of the file
        where it starts, for a source of several files."""
        if len(self.files) < 2:
            return {}
        parts = self._stitcher.episode_file
        return {"vd4rl/episode_file": np.concatenate(parts) if parts else np.zeros(0, np.int64)}

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield every file's rows as TED blocks, file by file, chunk by chunk."""
        packer = BlockPacker(self.block_rows)
        chunks = self._npz_chunks if self.kind == "npz" else self._hdf5_chunks
        for index, path in enumerate(self.files):
            for chunk in chunks(index, path):
                if progress is not None:
                    progress(len(chunk.start))
                block = self._stitcher.feed(chunk)
                if block is not None:
                    yield from packer.add_block(block)
        yield from packer.finish()

    def _chunk_rows(self) -> int:
        if self.block_rows is not None:
            return self.block_rows
        return rows_per_block(self._schema.row_bytes(), 1, _MAX_CHUNK_ROWS)

    # ------------------------------------------------------------------ Dreamer rows

    def _npz_chunks(self, index: int, path: Path) -> Iterator[Chunk]:
        ep = NpzEpisode(path)
        try:
            if ep.rows != self._rows[index]:
                raise SourceFormatError(f"{path} changed while it was converted")
            if ep.rows == 1:
                self._count("single", 1)
                self.report.dropped_rows += 1
            size = self._chunk_rows()
            stored = [ep.pixel, *self._schema.extras]
            wanted = [*stored, "action", "reward", *(k for k in NPZ_FLAGS if k in ep.streams)]
            for a in range(0, ep.rows, size):
                b = min(a + size, ep.rows)
                data = ep.read(wanted, b - a)
                flags = self._npz_flags(path, data, a, ep.rows)
                if a == 0:
                    self._first_row(data["action"][:1], data["reward"][:1])
                yield Chunk(
                    file=index,
                    obs={self._keys[k]: data[k] for k in stored},
                    action=data["action"],
                    reward=data["reward"],
                    **flags,
                )
        finally:
            ep.close()

    def _npz_flags(self, path: Path, data: dict[str, np.ndarray], a: int, rows: int) -> dict[str, np.ndarray]:
        """``start``/``end``/``terminal`` of rows ``a..`` of a Dreamer episode, checked: one episode per
        file, is_first on row 0 only, is_last and is_terminal on the last row only."""
        n = len(data["is_first"])
        pos = np.arange(a, a + n)
        first = data["is_first"].reshape(n) != 0
        last = data["is_last"].reshape(n) != 0
        if "is_terminal" in data:
            terminal = data["is_terminal"].reshape(n) != 0
        else:  # older Dreamer files: the environment terminated where the discount is 0
            terminal = data["discount"].reshape(n) == 0
        if a == 0 and not first[0]:
            raise SourceFormatError(
                f"{path}: is_first is not set on row 0; a Dreamer episode file starts with its reset row",
                hint="the file is not a Dreamer episode (or is damaged)",
            )
        for name, flag, allowed in (
            ("is_first", first, pos == 0),
            ("is_last", last, pos == rows - 1),
            (
                "is_terminal" if "is_terminal" in data else "discount == 0 (no is_terminal)",
                terminal,
                pos == rows - 1,
            ),
        ):
            wrong = np.flatnonzero(flag & ~allowed)
            if len(wrong):
                raise SourceFormatError(
                    f"{path}: {name} is set on row {a + int(wrong[0])} of {rows}; a Dreamer episode file "
                    "holds one episode (is_first on row 0 only; is_last, is_terminal on the last row only)",
                    hint="the file is not a Dreamer episode (or is damaged); rlds does not split it",
                )
        end = pos == rows - 1
        if end[-1] and not last[-1]:
            self._count("no_is_last", 1)
        return {"start": pos == 0, "end": end, "terminal": terminal}

    def _first_row(self, action: np.ndarray, reward: np.ndarray) -> None:
        """Count first rows whose action or reward is not zero padding (the shift assumes it is)."""
        if np.any(action != 0) or np.any(reward != 0):
            self._count("first_nonzero", 1)

    # ------------------------------------------------------------------ drqbc rows

    def _hdf5_chunks(self, index: int, path: Path) -> Iterator[Chunk]:
        shard = Shard(path)
        try:
            n = shard.rows
            if n != self._rows[index]:
                raise SourceFormatError(f"{path} changed while it was converted")
            # does the episode at this shard's end go on in the next shard?
            following = self._edges[index + 1][0] if index + 1 < len(self.files) else 0
            goes_on = self._edges[index][1] != 2 and following != 0
            if goes_on:
                self._count("joined", 1)
            size = self._chunk_rows()
            stored = ["observation", *self._schema.extras]
            for a in range(0, n, size):
                b = min(a + size, n)
                st = shard.step_type(a, min(b + 1, n))
                end = st[: b - a] == 2
                end[: len(st) - 1] |= st[1:] == 0
                if b == n:
                    end[-1] = st[b - a - 1] == 2 or not goes_on
                start = np.empty(b - a, bool)
                start[0] = self._prev_end
                start[1:] = end[:-1]
                self._prev_end = bool(end[-1])
                discount = shard.read("discount", a, b).reshape(b - a)
                terminal = discount == 0
                early = np.flatnonzero(terminal & ~end)
                if len(early):
                    row = a + int(early[0])
                    raise SourceFormatError(
                        f"{path}: discount is 0 at row {row} (step_type {int(st[early[0]])}), which does "
                        "not end an episode; an episode terminates on its last row only"
                    )
                action, reward = shard.read("action", a, b), shard.read("reward", a, b)
                st = st[: b - a]
                self._count("inferred_end", int(np.count_nonzero(end & (st != 2))))
                self._count("inferred_start", int(np.count_nonzero(start & (st != 0))))
                self._count("single", int(np.count_nonzero(start & end)))
                self.report.dropped_rows += int(np.count_nonzero(start & ((st != 0) | end)))
                for r in np.flatnonzero(start & (st == 0)):
                    self._first_row(action[r : r + 1], reward[r : r + 1])
                yield Chunk(
                    file=index,
                    obs={self._keys[k]: shard.read(k, a, b) for k in stored},
                    action=action,
                    reward=reward,
                    start=start,
                    end=end,
                    terminal=terminal,
                )
        finally:
            shard.close()

    # ------------------------------------------------------------------ notes

    def _count(self, kind: str, k: int) -> None:
        """Add ``k`` to a counted irregularity and keep its note current (``--episodes A:B`` may stop
        reading early)."""
        if not k:
            return
        self._counts[kind] = self._counts.get(kind, 0) + k
        text = _NOTES[kind].format(n=self._counts[kind])
        if kind in self._note_at:
            self.report.notes[self._note_at[kind]] = text
        else:
            self._note_at[kind] = len(self.report.notes)
            self.report.notes.append(text)
        if kind in ("inferred_end", "inferred_start"):
            self.report.inferred_boundaries += k
        if kind == "single":
            self.report.dropped_episodes += k


#: Notes of the counted irregularities (``{n}``: how many so far).
_NOTES = {
    "first_nonzero": "{n} episode(s) have a nonzero action or reward on their first row, which Dreamer fills "
    "with zeros: the one-step shift assumes that convention, check the source",
    "no_is_last": "{n} episode file(s) do not set is_last on their last row: ended there, truncated unless "
    "is_terminal says otherwise",
    "single": "{n} episode(s) of one row have no transition: dropped (dropped_episodes)",
    "joined": "{n} episode(s) run from one shard into the next (a shard ending without step_type 2, the next "
    "starting without 0): joined",
    "inferred_end": "{n} episode(s) end without step_type 2 (at the last shard's end, or before a "
    "step_type 0): ended there (inferred_boundaries)",
    "inferred_start": "{n} episode(s) start without step_type 0 (a shard starting mid-episode, or a row "
    "after step_type 2): that row's action and reward have no observation before them and are dropped "
    "(dropped_rows)",
}
