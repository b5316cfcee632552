"""Atomic, streaming construction of a cached dataset.

A :class:`DatasetBuilder` appends :class:`~rlds_cli.cache.ted.StepBlock` s as they stream in
(memory: one block) inside a :class:`~rlds_cli.cache.transaction.CacheTransaction`;
:meth:`DatasetBuilder.commit` writes the episode index and manifest and publishes.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from rlds_cli.cache import digest, episodes
from rlds_cli.cache import ted as rules
from rlds_cli.cache.backends import Backend, ColumnWriter, get_backend, save_npz
from rlds_cli.cache.backends.frames import FramesColumnWriter, column_writer
from rlds_cli.cache.layout import SOURCE_ARRAYS_FILE
from rlds_cli.cache.manifest import FieldSpec, Manifest, Storage
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cache.ted import StepBlock
from rlds_cli.cache.transaction import CacheTransaction
from rlds_cli.errors import ConversionError, FrameError
from rlds_cli.frames.codecs import MIN_SIDE, EncodedFrames, FrameFormat, FramesMode, block_rows, unencodable

_SINGLETON_KEYS = ("next/reward", "next/terminated", "next/truncated")
_FLAG_KEYS = ("next/terminated", "next/truncated")


class DatasetBuilder:
    """Build one dataset atomically. Use as a context manager.

    Args:
        name: Dataset name in the cache.
        root: Cache root (a :class:`CacheRoot`, a path, or ``None`` for the default).
        backend: ``"memmap"`` or ``"zarr"``.
        replace: Replace a dataset of the same name when committing.
        lock_timeout: Seconds to wait for another writer of the same name (``-1``: forever).
        frames: What to do with camera frames (:class:`~rlds_cli.frames.codecs.FramesMode` or
            its text: ``keep``, ``raw``, ``jpeg[:QUALITY]``, ``png``, ``webp``). Observation
            keys only; decided for each key from its first block.

    Attributes:
        existing: The manifest of the dataset already published under ``name`` (read once the
            lock is held), or ``None``.
    """

    def __init__(
        self,
        name: str,
        *,
        root: CacheRoot | str | os.PathLike[str] | None = None,
        backend: str = "memmap",
        replace: bool = False,
        lock_timeout: float = -1,
        frames: FramesMode | str | None = None,
    ) -> None:
        self.frames = FramesMode.parse(frames)
        self._txn = CacheTransaction(name, root=root, replace=replace, lock_timeout=lock_timeout)
        self.name = self._txn.name
        self.root = self._txn.cache
        self.backend: Backend = get_backend(backend)
        self.replace = replace
        self.existing: Manifest | None = None
        self._columns: dict[str, ColumnWriter] = {}
        # content digests, fed with the rows as they are appended (no second read at commit)
        self._hashers: dict[str, digest.ColumnHasher] = {}
        self._block_hasher = digest.BlockHasher()  # a block's digests beside its writes
        self._specs: dict[str, FieldSpec] = {}
        self._frame_columns: dict[str, FramesColumnWriter] = {}  # keys stored as image files
        self._frame_notes: list[str] = []  # image-like keys --frames CODEC leaves arrays
        self._ends: list[np.ndarray] = []
        self._final_known: list[np.ndarray] = []
        self._episode_ids: list[np.ndarray] = []
        self._num_steps = 0
        self._open_episode = False

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> DatasetBuilder:
        self._txn.__enter__()
        try:
            self.existing = self._txn.existing
            self._txn.new_build_dir()
        except BaseException:
            self._txn.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._block_hasher.close()
        if exc_type is not None:  # the build is dropped: its writers' files and threads released
            for column in self._columns.values():
                column.abort()
        self._txn.__exit__(exc_type, exc, tb)

    @property
    def num_steps(self) -> int:
        """Transitions appended so far."""
        return self._num_steps

    @property
    def build_dir(self) -> Path:
        """The private directory the dataset is built in."""
        try:
            return self._txn.build_dir
        except RuntimeError:
            raise RuntimeError("DatasetBuilder used outside its 'with' block") from None

    # ------------------------------------------------------------------ appending

    def append(self, block: StepBlock) -> None:
        """Validate one block against the TED rules and append it to every column.

        Raises:
            ConversionError: The block breaks a TED rule or differs from the first block's schema.
        """
        n = block.num_steps
        if n == 0:
            return
        steps = {k: _normalise_step_column(k, v) for k, v in block.steps.items()}
        observations = {k: self._arriving_frames(k, v) for k, v in block.observations.items()}
        ends = np.asarray(block.ends, dtype=np.int64).reshape(-1)
        self._check_block(steps, observations, ends, n)
        if not self._columns:
            self._create_columns(steps, observations)
        self._check_schema(steps, observations)
        columns = [*steps.items(), *observations.items()]
        # a frame column's writer hashes the bytes it stores
        hashed = [(self._hashers[key], rows) for key, rows in columns if key not in self._frame_columns]
        wait = self._block_hasher.start(hashed)
        try:
            for key, rows in columns:
                self._columns[key].append(rows)
        finally:
            wait()  # the rows are the caller's again only once they are hashed
        if self._txn.fsync:
            for column in self._columns.values():
                column.write_behind()
        k = len(ends)
        self._ends.append(ends + self._num_steps)
        self._final_known.append(
            np.ones(k, bool) if block.final_known is None else np.asarray(block.final_known, bool).reshape(k)
        )
        ids = block.episode_ids
        self._episode_ids.append(
            np.full(k, -1, np.int64) if ids is None else np.asarray(ids, np.int64).reshape(k)
        )
        self._num_steps += n
        self._open_episode = not (k and ends[-1] == n - 1)

    def _check_block(self, steps: dict[str, np.ndarray], observations: Any, ends: np.ndarray, n: int) -> None:
        """Check one block's episode rules (:mod:`rlds_cli.cache.ted`); a break raises
        :class:`ConversionError` (a reader's bug)."""
        if (problem := rules.missing_step_keys(steps)) is not None:
            raise ConversionError(f"block lacks required keys {list(problem.keys)}")
        if not observations:
            raise ConversionError("block has no observation-like keys")
        if (problem := rules.rows_problem(steps, n)) is not None:
            raise ConversionError(f"step column {problem.key!r} has {_rows(problem)}, expected {n}")
        if (problem := rules.rows_problem(observations, n + len(ends))) is not None:
            raise ConversionError(
                f"observation column {problem.key!r} has {_rows(problem)}, "
                f"expected {n} steps + {len(ends)} final observations"
            )
        if rules.ends_problem(ends, n) is not None:
            raise ConversionError("episode ends must be sorted, unique and inside the block")
        done = (steps["next/terminated"] | steps["next/truncated"]).reshape(n)
        if (problem := rules.done_problem(done, rules.last_steps(ends, 0, n))) is not None:
            assert problem.step is not None  # a done problem always names its step
            raise ConversionError(
                f"step {problem.step + self._num_steps}: next/done must be True exactly at episode ends "
                "(terminated or truncated marks the last step of an episode)"
            )

    def _arriving_frames(self, key: str, rows: Any) -> Any:
        """``rows`` as the builder takes them: encoded frames are decoded only when stored as a
        plain array."""
        if not isinstance(rows, EncodedFrames):
            return rows
        spec = self._specs.get(key)
        if (spec is None and self._stored_format(rows) is None) or (spec is not None and spec.codec == "raw"):
            try:
                return rows.decode()
            except FrameError as exc:
                raise ConversionError(
                    f"a frame of {key!r} (the block from step {self._num_steps}) does not decode: "
                    f"{exc.message}",
                    hint="the source's image file is damaged: download it again",
                ) from None
        return rows

    def _stored_format(self, rows: Any) -> FrameFormat | None:
        """The frame format of an observation column first seen as ``rows`` (``None``: plain
        array; :mod:`rlds_cli.frames.codecs`)."""
        if isinstance(rows, EncodedFrames):
            return self.frames.stored_format(rows.format.shape, rows.dtype, rows.format)
        rows = np.asarray(rows)
        return self.frames.stored_format(tuple(rows.shape[1:]), rows.dtype)

    def _create_columns(self, steps: dict[str, np.ndarray], observations: Any) -> None:
        kinds: tuple[tuple[Storage, Any], ...] = (("step", steps), ("flat", observations))
        for storage, columns in kinds:
            for key, rows in columns.items():
                if storage == "flat" and key.startswith("next/"):
                    raise ConversionError(f"observation-like key {key!r} must not start with 'next/'")
                fmt = self._stored_format(rows) if storage == "flat" else None
                if fmt is not None:
                    spec = FieldSpec(key, fmt.shape, "uint8", storage, fmt.codec, fmt.channels_first)
                else:
                    rows = np.asarray(rows)
                    spec = FieldSpec(key, tuple(rows.shape[1:]), dtype_name(rows.dtype), storage)
                    self._note_unencoded(spec)
                self._specs[key] = spec
                # keep never encodes: later frames not in the first block's form are refused
                encodes = self.frames.codec is not None
                column = self._columns[key] = column_writer(
                    self.backend, self.build_dir, spec, self.frames.quality, encodes=encodes
                )
                if isinstance(column, FramesColumnWriter):
                    self._frame_columns[key] = column
                else:
                    self._hashers[key] = digest.ColumnHasher(spec.dtype)

    def _note_unencoded(self, spec: FieldSpec) -> None:
        """A conversion note for an image-like column that ``--frames CODEC`` leaves an array."""
        codec = self.frames.codec
        why = None if codec is None or spec.storage != "flat" else unencodable(spec.shape, spec.dtype, codec)
        if why is not None:
            shape = "x".join(map(str, spec.shape))
            self._frame_notes.append(f"--frames {self.frames}: {spec.key} ({shape}) stays an array: {why}")

    def _check_schema(self, steps: dict[str, np.ndarray], observations: Any) -> None:
        seen = {
            **steps,
            **{k: block_rows(v) for k, v in observations.items()},
        }
        if set(seen) != set(self._specs):
            raise ConversionError(
                f"block keys {sorted(seen)} differ from the first block's {sorted(self._specs)}"
            )
        for key, rows in seen.items():
            spec = self._specs[key]
            if tuple(rows.shape[1:]) != spec.shape or dtype_name(rows.dtype) != spec.dtype:
                raise ConversionError(
                    f"key {key!r}: block has shape {rows.shape[1:]} {rows.dtype}, "
                    f"first block had {spec.shape} {spec.dtype}"
                )

    # ------------------------------------------------------------------ commit

    def commit(
        self,
        *,
        source: dict[str, Any] | None = None,
        conversion: dict[str, Any] | None = None,
        lineage: list[dict[str, Any]] | None = None,
        source_arrays: dict[str, np.ndarray] | None = None,
        card: dict[str, Any] | None = None,
        env: dict[str, Any] | None = None,
    ) -> Manifest:
        """Finish every column, write the episode index and manifest (``env``:
        :attr:`~rlds_cli.cache.manifest.Manifest.env`), and publish.

        Returns:
            The manifest of the published dataset.
        """
        if self._num_steps == 0:
            raise ConversionError(f"no transitions to write for dataset {self.name!r}")
        if self._open_episode:
            raise ConversionError("the last episode was never closed (its last step has no end flag)")
        self._txn.check_free()
        # not fsynced here: the seal fsyncs every file once (a second per-file fsync cost 6/18
        # of a small conversion)
        for key, column in self._columns.items():
            rows = column.close(fsync=False)
            expected = self._num_steps + (self._num_episodes() if self._specs[key].storage == "flat" else 0)
            if rows != expected:  # pragma: no cover - guarded by append's checks
                raise ConversionError(f"column {key!r} has {rows} rows, expected {expected}")
        index = episodes.build_index(
            np.concatenate(self._ends), np.concatenate(self._episode_ids), np.concatenate(self._final_known)
        )
        episodes.write_index(self.build_dir, index, fsync=False)
        if source_arrays:
            save_npz(
                self.build_dir / SOURCE_ARRAYS_FILE,
                {k.replace("/", "__"): v for k, v in source_arrays.items()},
            )
        digests = {key: hasher.hexdigest() for key, hasher in self._hashers.items()}
        digests.update({key: column.hasher.hexdigest() for key, column in self._frame_columns.items()})
        if self._frame_columns:
            conversion = {**(conversion or {}), "frames": self.frames_report()}
        elif self.frames.codec is not None and not self._frame_notes:
            self._frame_notes.append(
                f"--frames {self.frames}: no observation key holds camera frames (uint8 images, "
                f"both sides >= {MIN_SIDE} px): every key stays an array"
            )
        if self._frame_notes:
            conversion = dict(conversion or {})
            conversion["notes"] = [*conversion.get("notes", []), *self._frame_notes]
        content = digest.record(
            digests,
            index,
            self.build_dir / SOURCE_ARRAYS_FILE,
        )
        manifest = Manifest(
            name=self.name,
            backend=self.backend.name,
            num_steps=self._num_steps,
            num_episodes=self._num_episodes(),
            fields=dict(self._specs),
            source=source or {},
            conversion=conversion or {},
            lineage=lineage or [],
            content_digest=content,
            card=card or {},
            env=env or {},
        )
        self._txn.commit(manifest)
        return manifest

    def _num_episodes(self) -> int:
        return int(sum(len(e) for e in self._ends))

    def frames_report(self) -> dict[str, Any]:
        """The frames mode and, per frame column, its codec and counts of ``kept`` and
        ``encoded`` frames."""
        return {
            "mode": str(self.frames),
            "columns": {
                key: {"codec": column.format.codec, "kept": column.kept, "encoded": column.encoded}
                for key, column in self._frame_columns.items()
            },
        }


def dtype_name(dtype: np.dtype) -> str:
    """The manifest's name for a dtype: ``float32``-style (native order) for numbers, numpy's
    ``str`` form otherwise."""
    dtype = np.dtype(dtype)
    if dtype.kind in "biufc":
        return dtype.newbyteorder("=").name
    return dtype.str


def _rows(problem: rules.Problem) -> str:
    return "no row axis (0-d)" if problem.rows is None else f"{problem.rows} rows"


def _normalise_step_column(key: str, rows: np.ndarray) -> np.ndarray:
    """Give reward and done flags TED's trailing singleton dimension and flags a bool dtype."""
    rows = np.asarray(rows)
    if key in _SINGLETON_KEYS and rows.ndim == 1:
        rows = rows[:, None]
    if key in _FLAG_KEYS and rows.dtype != np.bool_:
        rows = rows != 0
    return rows
