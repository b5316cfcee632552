"""D4RL HDF5 files: one file of concatenated episodes, streamed into flat TED.

Row ``i`` is ``(s_i, a_i, r_i)``; ``terminals[i]``: the environment terminated after ``a_i``;
``timeouts[i]``: the episode was cut after it. Episodes end at ``terminals | timeouts``. Rules
(``docs/formats.md``):

* With ``next_observations``: every row is a transition whose next observation is
  ``next_observations[i]``, at episode ends too. Where it differs from ``observations[i + 1]``
  without an end flag (an unflagged reset, antmaze v0), the episode ends there as truncated and
  is counted in ``inferred_boundaries``.
* Without ``next_observations``, an episode's final observation is not in the file
  (``observations[i + 1]`` is the next episode's first). Then:

  - an episode cut by a timeout (or the end of the file) keeps rows ``s .. e-1``, with row ``e``'s
    observation as its final one; row ``e``'s action and reward are dropped and step ``e-1`` is
    marked truncated;
  - an episode terminating at row ``e`` keeps all rows (value learning needs the terminal
    signal); ``observations[e]`` is repeated as its final observation, ``final_known = False``.

  No transition ever gets another episode's first observation as its next observation.
* The file's last row always ends an episode (truncated unless terminal).
* Files without ``timeouts``: with ``next_observations``, boundaries come from terminals and
  observation continuity; otherwise ``max_episode_steps`` must be given (an episode is cut after
  that many rows), or the conversion fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli._util.rows import insert_rows, rows_equal
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
from rlds_cli.formats.folders import folder_files
from rlds_cli.formats.hdf5_util import (
    ChunkRows,
    collect_metadata,
    hdf5_top_keys,
    inflatable,
    is_hdf5_name,
    open_hdf5,
    read_error,
    read_rows,
    to_jsonable,
)
from rlds_cli.formats.npz_util import NpzAsH5, NpzColumn, npz_names
from rlds_cli.formats.untrusted import check_side_array, require_numeric, require_rows

REQUIRED_KEYS = ("observations", "actions", "rewards", "terminals")
_KNOWN = {*REQUIRED_KEYS, "timeouts", "next_observations"}
#: Suffixes of the files a D4RL source folder is searched for.
_SUFFIXES = (".hdf5", ".h5", ".npz")


def sniff(path: Path) -> bool:
    """Whether ``path`` is a D4RL file: an HDF5 file with any of D4RL's root datasets (so the reader can
    name what is missing), one that will not open (so the reader says why; Minari's
    ``main_data.hdf5`` excepted), or an ``.npz`` of the D4RL layout (``rlds export --to npz``; OGBench
    files have no rewards/timeouts)."""
    if is_hdf5_name(path):
        keys = hdf5_top_keys(path)
        return path.name != "main_data.hdf5" if keys is None else any(k in keys for k in REQUIRED_KEYS)
    names = set(npz_names(path) or ())
    return set(REQUIRED_KEYS) <= names and bool(names & {"timeouts", "next_observations"})


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The given files, or a folder's ``.hdf5``/``.h5``/``.npz`` files. The reader takes one; a folder
    of several is refused by :func:`rlds_cli.sources.convert.convert`, naming them."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += folder_files(p, lambda q: q.suffix.lower() in _SUFFIXES)  # hidden, .tmp: not read
        else:
            out.append(p)
    return out


@dataclass(frozen=True)
class D4RLOptions(ReaderOptions):
    """Options of :class:`D4RLReader` (its keyword arguments)."""

    max_episode_steps: int | None = None
    block_rows: int | None = None


class D4RLReader(Reader):
    """Streams a D4RL-format HDF5 file as :class:`StepBlock` s.

    Args:
        path: The ``.hdf5`` file.
        max_episode_steps: The environment's time limit, used only when the file has no
            ``timeouts`` (and no ``next_observations`` to find boundaries with).
        block_rows: Rows per block (default: about 8 MiB of source data).
    """

    format_name = "d4rl"
    expected_files = "one .hdf5/.h5 (or .npz) file with observations, actions, rewards and terminals"
    Options = D4RLOptions
    reads_one_file = True
    sniff = staticmethod(sniff)
    source_files = staticmethod(source_files)

    def __init__(
        self, path: str | Path, *, max_episode_steps: int | None = None, block_rows: int | None = None
    ) -> None:
        self.path = Path(path)
        self.max_episode_steps = max_episode_steps
        self.report = ConversionReport(rules="d4rl-v1")
        self._datasets: dict[str, Any] = {}
        self._buffers: dict[str, np.ndarray] = {}  # see _read_inside
        self._inflated: set[str] = set()  # keys whose gzip chunks ChunkRows inflates (see _dataset)
        self._chunk_rows = ChunkRows()
        # the same layout in an .npz (what 'rlds export --to npz' writes) reads through a facade
        self._file = NpzAsH5(self.path) if self.path.suffix.lower() == ".npz" else open_hdf5(self.path)
        try:
            self._inspect(block_rows)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._chunk_rows.close()
        self._file.close()

    # ------------------------------------------------------------------ schema

    def _inspect(self, block_rows: int | None) -> None:

        f = self._file
        missing = [k for k in REQUIRED_KEYS if not _is_array(f.get(k))]
        if missing:
            raise SourceFormatError(
                f"{self.path} has no {missing[0]!r} dataset; a D4RL file needs "
                f"{', '.join(REQUIRED_KEYS)} (found: {', '.join(sorted(f.keys())) or 'nothing'})",
                hint="check the file, or pass --format for another source format",
            )
        # untrusted input: every step array has a row axis and numbers (or bools) in it
        for key in (*REQUIRED_KEYS, "timeouts", "next_observations"):
            if _is_array(f.get(key)):
                require_rows(self.path, key, self._dataset(key).shape)
                require_numeric(self.path, key, self._dataset(key).dtype)
        self.n = int(self._dataset("observations").shape[0])
        if self.n == 0:
            raise SourceFormatError(f"{self.path}: 'observations' is empty")
        self.has_next = _is_array(f.get("next_observations"))
        self.has_timeouts = _is_array(f.get("timeouts"))
        self.info_keys: dict[str, str] = {}  # TED key -> HDF5 path
        self.extra_keys: list[str] = []
        arrays_meta: dict[str, np.ndarray] = {}
        self._meta: dict[str, Any] = {}

        per_row: dict[str, tuple[str, ...]] = {}  # HDF5 path -> TED key parts before cleaning

        def visit(name: str, obj: Any) -> None:
            if not _is_array(obj) or name in _KNOWN or name.startswith(("metadata/", "virtual/")):
                return
            if obj.shape[:1] == (self.n,):
                if is_text(obj.dtype):  # h5py vlen strings: object pointers, never stored
                    self.report.notes.append(text_note(name, obj.dtype))
                else:
                    require_numeric(self.path, name, obj.dtype)
                    per_row[name] = _ted_info_parts(name)
                return
            # a side array is read whole: only up to a size limit (docs/formats.md, "Untrusted input")
            check_side_array(self.path, name, obj.shape, obj.dtype)
            if is_text(obj.dtype):
                self._meta[name] = to_jsonable(np.asarray(obj[()]))
            else:
                arrays_meta[name] = np.asarray(obj[()])
                self.extra_keys.append(name)

        f.visititems(visit)
        # one cleaner for every reader: 'infos/a b' and 'infos/a_b' get distinct keys
        cleaned = clean_keys(per_row)
        self.info_keys = {cleaned[name]: name for name in sorted(per_row)}
        renamed = renamed_note(cleaned, per_row)
        if renamed:
            self.report.notes.append(renamed)
        for key in (
            "actions",
            "rewards",
            "terminals",
            "timeouts",
            "next_observations",
            *self.info_keys.values(),
        ):
            if key in f and self._dataset(key).shape[:1] != (self.n,):
                raise SourceFormatError(
                    f"{self.path}: {key!r} has {self._dataset(key).shape[0]} rows but 'observations' "
                    f"has {self.n}",
                    hint="the file is inconsistent; re-download it",
                )
        if (
            self.has_next
            and self._dataset("next_observations").shape[1:] != self._dataset("observations").shape[1:]
        ):
            raise SourceFormatError(
                f"{self.path}: 'next_observations' has shape {f['next_observations'].shape[1:]} per row, "
                f"'observations' {f['observations'].shape[1:]}"
            )
        for key in ("rewards", "terminals", "timeouts"):
            if key in f and self._dataset(key).shape[1:] not in ((), (1,)):
                raise SourceFormatError(
                    f"{self.path}: {key!r} must have one value per row, has shape {self._dataset(key).shape}"
                )
        if not self.has_timeouts:
            if self.has_next:
                self.report.notes.append(
                    "no 'timeouts' in the file: episodes end at terminals and where "
                    "next_observations[i] != observations[i+1]"
                )
            elif self.max_episode_steps:
                self.report.notes.append(
                    f"no 'timeouts' in the file: episodes cut every {self.max_episode_steps} steps "
                    "(max_episode_steps) and at terminals"
                )
            else:
                raise SourceFormatError(
                    f"{self.path} has no 'timeouts' and no 'next_observations', so its episode ends "
                    "cannot be found",
                    hint="pass --max-episode-steps N (the environment's time limit)",
                )
        if "virtual" in f:
            self.report.notes.append("the 'virtual/' chunk group is ignored (it repeats the main arrays)")
        if "metadata" in f and not isinstance(f, NpzAsH5):
            collect_metadata(self._dataset("metadata"), "metadata", self._meta, arrays_meta)
        collect_metadata_root_attrs(f, self._meta)
        self._arrays = arrays_meta
        row_bytes = (
            sum(
                int(np.prod(self._dataset(k).shape[1:], dtype=np.int64)) * self._dataset(k).dtype.itemsize
                for k in ("observations", "actions", "rewards", *self.info_keys.values())
            )
            * (2 if self.has_next else 1)
            + 2
        )
        self.block_rows = block_rows or rows_per_block(row_bytes, 1024, 1 << 18)
        self.report.source_rows = self.n

    def total_rows(self) -> int:
        return self.n

    def source_metadata(self) -> dict[str, Any]:
        return dict(self._meta)

    def source_arrays(self) -> dict[str, np.ndarray]:
        return dict(self._arrays)

    # ------------------------------------------------------------------ streaming

    def _dataset(self, key: str) -> Any:
        """``self._file[key]``, looked up once (an h5py lookup costs ~60 us, for every key of every block)."""
        found = self._datasets.get(key)
        if found is None:
            found = self._datasets[key] = self._file[key]
            if inflatable(found):
                self._inflated.add(key)
        return found

    def _read(self, key: str, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        dataset = self._dataset(key)
        try:
            return read_rows(self._chunk_rows, dataset, start, stop, out, inflated=key in self._inflated)
        except (OSError, RuntimeError) as exc:
            raise read_error(self.path, key, exc) from exc

    def _read_inside(self, key: str, start: int, stop: int) -> np.ndarray:
        """``_read`` into a buffer reused from block to block, for rows copied on into the flat layout
        (observations, next observations): fresh memory faults per 4 KiB page (several us each,
        docs/benchmarks.md), and two fresh arrays per block were a third of a low-dim conversion's faults."""
        dataset = self._dataset(key)
        if not hasattr(dataset, "read_direct"):  # an .npz member: read forward as it is
            return self._read(key, start, stop)
        rows = stop - start
        buf = self._buffers.get(key)
        if buf is None or len(buf) < rows:
            shape = (max(rows, self.block_rows + 1), *dataset.shape[1:])
            buf = self._buffers[key] = np.empty(shape, dataset.dtype)
        return self._read(key, start, stop, buf[:rows])

    def _flags(self, key: str, start: int, stop: int) -> np.ndarray:
        return self._read(key, start, stop).reshape(-1) != 0

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield the file as blocks of at most ``block_rows`` source rows."""
        state = _StreamState()
        for start in range(0, self.n, self.block_rows):
            stop = min(start + self.block_rows, self.n)
            for key in self._inflated:  # the next block's chunks inflate while this one converts
                self._chunk_rows.prefetch(self._datasets[key], stop, min(stop + self.block_rows + 1, self.n))
            block = self._block(start, stop, state)
            if block is not None:
                yield block
            if progress is not None:
                progress(stop - start)

    def _end_flags(
        self, start: int, look: int, obs: np.ndarray, state: _StreamState
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Terminal, timeout, end and inferred-end flags for rows ``start .. look-1`` (the last may be one
        row of lookahead into the next block)."""
        term = self._flags("terminals", start, look)
        tout = self._flags("timeouts", start, look) if self.has_timeouts else np.zeros(look - start, bool)
        end = term | tout
        inferred = np.zeros(len(end), bool)
        if self.has_next:
            nxt = self._read_inside("next_observations", start, look)
            # a row whose next observation is not the following row: an unflagged reset
            inferred[:-1] = ~rows_equal(nxt[:-1], obs[1:])
            state.next_obs = nxt
        elif not self.has_timeouts:
            inferred = _time_limit_ends(term, state.steps_in_episode, int(self.max_episode_steps or 0))
        inferred &= ~end
        end |= inferred
        if look == self.n:
            end[-1] = True  # the file's last row always closes an episode
        return term, tout, end, inferred

    def _block(self, start: int, stop: int, state: _StreamState) -> StepBlock | None:
        rows = stop - start
        look = min(stop + 1, self.n)  # one row of lookahead: next observation / next row's flags
        obs = self._read_inside("observations", start, look)
        term, tout, end, inferred = self._end_flags(start, look, obs, state)
        self.report.inferred_boundaries += int(inferred[:rows].sum())
        ends = np.flatnonzero(end[:rows])
        state.steps_in_episode = rows - 1 - int(ends[-1]) if len(ends) else state.steps_in_episode + rows
        if self.has_next:
            return self._block_with_next(start, stop, obs, term[:rows], end[:rows], tout[:rows], state)
        return self._block_without_next(start, stop, obs, term, end, tout[:rows], state)

    def _step_columns(self, start: int, stop: int, keep: np.ndarray | None) -> dict[str, np.ndarray]:
        cols = {
            "action": self._read("actions", start, stop),
            "next/reward": self._read("rewards", start, stop).reshape(-1, 1),
        }
        for ted_key, h5_key in self.info_keys.items():
            cols[ted_key] = self._read(h5_key, start, stop)
        if keep is not None:
            cols = {k: v[keep] for k, v in cols.items()}
        return cols

    def _block_with_next(
        self,
        start: int,
        stop: int,
        obs: np.ndarray,
        term: np.ndarray,
        end: np.ndarray,
        tout: np.ndarray,
        state: _StreamState,
    ) -> StepBlock:
        rows = stop - start
        steps = self._step_columns(start, stop, None)
        steps["next/terminated"] = term[:, None]
        steps["next/truncated"] = (tout | (end & ~term))[:, None]
        ends = np.flatnonzero(end)
        finals = state.next_obs[:rows][ends]
        flat = insert_rows(obs[:rows], ends, finals)
        return StepBlock(steps=steps, observations={"observation": flat}, ends=ends)

    def _block_without_next(
        self,
        start: int,
        stop: int,
        obs: np.ndarray,
        term: np.ndarray,
        end: np.ndarray,
        tout: np.ndarray,
        state: _StreamState,
    ) -> StepBlock | None:
        rows = stop - start
        dropped = end & ~term  # rows whose next observation is unknown and not terminal
        kept = ~dropped[:rows]
        nxt_dropped = dropped[1 : rows + 1]
        if len(nxt_dropped) < rows:  # the file's last row has no successor
            nxt_dropped = np.append(nxt_dropped, False)
        last = kept & (term[:rows] | nxt_dropped)
        episode_start = np.concatenate([[state.prev_end], end[: rows - 1]])
        self.report.dropped_rows += int(dropped[:rows].sum())
        self.report.dropped_episodes += int((dropped[:rows] & episode_start).sum())
        state.prev_end = bool(end[rows - 1])
        if not kept.any():
            return None
        steps = self._step_columns(start, stop, kept)
        k_term = term[:rows][kept]
        k_last = last[kept]
        steps["next/terminated"] = k_term[:, None]
        steps["next/truncated"] = ((tout[kept] & k_term) | (k_last & ~k_term))[:, None]
        ends = np.flatnonzero(k_last)
        rows_idx = np.flatnonzero(kept)[ends]  # source rows (relative) of each episode's last step
        synth = term[rows_idx]
        finals = np.where(
            synth.reshape(-1, *[1] * (obs.ndim - 1)),
            obs[rows_idx],
            obs[np.minimum(rows_idx + 1, len(obs) - 1)],
        )
        self.report.synthesized_final_observations += int(synth.sum())
        flat = insert_rows(obs[:rows][kept], ends, finals)
        return StepBlock(steps=steps, observations={"observation": flat}, ends=ends, final_known=~synth)


class _StreamState:
    """What one block must know about the previous one."""

    def __init__(self) -> None:
        self.prev_end = True  # row -1 "ended", so row 0 starts an episode
        self.steps_in_episode = 0
        self.next_obs: np.ndarray = np.empty(0)


def _time_limit_ends(term: np.ndarray, steps_before: int, limit: int) -> np.ndarray:
    """Rows where a time limit of ``limit`` steps cuts an episode (files without timeouts).
    ``steps_before``: steps the episode open at the first row has already taken.
    """
    n = len(term)
    prev_term = np.zeros(n, bool)
    prev_term[1:] = term[:-1]
    segment = np.cumsum(prev_term)
    first_row = np.flatnonzero(np.concatenate([[True], prev_term[1:]]))
    t = np.arange(n) - first_row[segment]
    t[segment == 0] += steps_before
    return (t % limit == limit - 1) & ~term


def _is_array(obj: Any) -> bool:
    """An HDF5 dataset, or an array member of an ``.npz``."""
    import h5py

    return isinstance(obj, h5py.Dataset | NpzColumn)


def _ted_info_parts(h5_name: str) -> tuple[str, ...]:
    """``infos/qpos`` -> ``info/qpos``; other per-row datasets keep their path under ``info/`` (as key
    parts for :func:`rlds_cli.formats.base.clean_keys`)."""
    name = h5_name[len("infos/") :] if h5_name.startswith("infos/") else h5_name
    return ("info", *name.split("/"))


def collect_metadata_root_attrs(f: Any, meta: dict[str, Any]) -> None:
    """File-level attributes (some D4RL files carry env names there)."""
    from rlds_cli.formats.hdf5_util import to_jsonable

    for attr, value in f.attrs.items():
        meta[f"@{attr}"] = to_jsonable(value)
