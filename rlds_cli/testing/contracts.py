"""The contracts rlds's plug points keep: base classes of tests to subclass in a ``test_*.py`` file,
one test per promise.

* :class:`ReaderContract`: a source format reader (built in, or added through the
  ``rlds_cli.readers`` entry-point group) against :class:`rlds_cli.formats.base.Reader`. Set
  ``reader_cls`` and implement ``write_source(tmp_path)`` (a small source of the format).
* :class:`BackendContract`: a storage backend against :class:`rlds_cli.cache.backends.Backend`:
  columns appended in any sizes read back exactly by every kind of index; a missing file is
  reported by ``check_column``; a key that is no safe path is refused before any write; a
  preallocated column written region by region, in any order, equals the appended one file for
  file; a region that could share a file with another is refused. Implement ``backend``.
* :class:`ExporterContract`: an ``rlds export`` format against
  :func:`rlds_cli.export.export_dataset`: the output reads back (with rlds's readers) as the
  dataset; an existing output is kept unless ``overwrite``; a failed export leaves nothing beside
  the output; ``progress`` hears of every step exactly once. Set ``format`` (a key of
  ``rlds_cli.export.EXPORTERS``).
* :class:`SamplerContract` (and :class:`EpochalContract`, :class:`PrioritizedContract`): a sampler
  against :mod:`rlds_cli.loader.protocols`. Implement ``make(episodes, seed, rank, world_size)``.
* :class:`ExecutorContract`: a ``rlds preprocess`` executor against
  :class:`rlds_cli.preprocess.executors.Executor`; each test runs a real job (``preprocess.run``)
  with its executor forced to this one and its ``on_done`` watched. Set ``name`` (a key of
  :data:`~rlds_cli.preprocess.executors.EXECUTORS`) and the workers.

For example::

    from rlds_cli.testing.contracts import ReaderContract

    class TestMyReader(ReaderContract):
        reader_cls = MyReader

        def write_source(self, tmp_path):
            return write_my_file(tmp_path / "x.my")
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
import multiprocessing
import pickle
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from rlds_cli import preprocess
from rlds_cli.cache.backends import Backend
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.errors import (
    CorruptDatasetError,
    DatasetNotFoundError,
    ExportError,
    InvalidKeyError,
    LoaderStateError,
    UserFunctionError,
)
from rlds_cli.export import export_dataset
from rlds_cli.formats import detect_format, reader_class
from rlds_cli.formats.base import REQUIRED_STEP_KEYS, Reader, StepBlock, parse_options
from rlds_cli.formats.select import select_blocks
from rlds_cli.loader.protocols import Checkpointable, Epochal, Prioritized, Sampler
from rlds_cli.loader.samplers import Draw, Episodes
from rlds_cli.preprocess import executors
from rlds_cli.preprocess.executors import Executor, OnDone, Task
from rlds_cli.sources.convert import convert
from rlds_cli.testing.sources import golden_three_episodes, make_dataset, ogbench_file


class ReaderContract:
    """Tests every reader passes; subclasses set :attr:`reader_cls` and implement
    :meth:`write_source`."""

    reader_cls: type[Reader]
    #: Rows per block the blocks test reads the source with (small: several blocks per source;
    #: ``None`` for a reader without the option).
    block_rows: int | None = None
    #: Whether detection finds the format (``False``: recognised only through ``--format``).
    detected = True

    def write_source(self, tmp_path: Path) -> Path:
        """A small source of the format under ``tmp_path``: what ``rlds download PATH`` takes."""
        raise NotImplementedError

    def write_other_source(self, tmp_path: Path) -> Path:
        """A source of another format, which this reader must not claim (default: OGBench)."""
        tmp_path.mkdir(parents=True, exist_ok=True)
        return ogbench_file(tmp_path / "other.npz")

    def sniffed(self, source: Path) -> Path:
        """What :meth:`Reader.sniff` recognises in ``source``: the source itself, or, for a
        folder of files that detection scans (Roboset, AMAGO), one of its files."""
        return source

    def reader_argument(self, source: Path) -> Any:
        """What ``convert`` hands the reader for ``source`` (a one-file format gets the file)."""
        return source

    @pytest.fixture
    def source(self, tmp_path: Path) -> Path:
        return self.write_source(tmp_path / "src")

    def open(self, source: Path) -> Reader:
        options = {} if self.block_rows is None else {"block_rows": self.block_rows}
        return self.reader_cls(self.reader_argument(source), **options)

    def test_is_the_registered_reader_of_its_format(self) -> None:
        assert issubclass(self.reader_cls, Reader)
        assert reader_class(self.reader_cls.format_name) is self.reader_cls

    def test_sniff_recognises_its_own_source(self, source: Path) -> None:
        assert self.reader_cls.sniff(self.sniffed(source))
        if self.detected:
            assert detect_format(source) == self.reader_cls.format_name

    def test_sniff_rejects_another_format_and_never_raises(self, tmp_path: Path) -> None:
        other = self.write_other_source(tmp_path / "other")
        assert not self.reader_cls.sniff(other)
        (tmp_path / "notes.txt").write_text("hello")
        assert not self.reader_cls.sniff(tmp_path / "notes.txt")
        assert not self.reader_cls.sniff(tmp_path / "missing")

    def test_source_files_are_existing_files(self, source: Path) -> None:
        files = self.reader_cls.source_files([source])
        assert files and all(f.is_file() for f in files)
        assert files == self.reader_cls.source_files([source])  # the same order every time

    def test_options_are_the_keyword_arguments(self) -> None:
        """The Options dataclass and ``__init__`` agree on names and defaults."""
        params = inspect.signature(self.reader_cls.__init__).parameters
        keywords = {n: p.default for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
        assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        defaults = {f.name: f.default for f in dataclasses.fields(self.reader_cls.Options)}
        assert defaults == keywords

    def test_options_defaults_round_trip(self) -> None:
        """Each default passes the options check unchanged, and so does its string spelling
        (what ``--option key=value`` gives)."""
        defaults = dataclasses.asdict(self.reader_cls.Options())
        assert parse_options(self.reader_cls, defaults) == defaults
        spelled = {k: "none" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
                   for k, v in defaults.items()}  # fmt: skip
        assert parse_options(self.reader_cls, spelled) == defaults

    def test_an_unknown_option_is_refused_naming_the_format(self) -> None:
        from rlds_cli.errors import SourceError

        with pytest.raises(SourceError, match=f"does not apply to the {self.reader_cls.format_name} format"):
            parse_options(self.reader_cls, {"no_such_option": "1"})

    def test_blocks_are_step_blocks_of_consistent_lengths(self, source: Path) -> None:
        rows_seen: list[int] = []
        with self.open(source) as reader:
            total = reader.total_rows()
            assert isinstance(total, int) and total >= 0
            blocks = list(reader.blocks(rows_seen.append))
            json.dumps(reader.source_metadata())
            assert all(isinstance(a, np.ndarray) for a in reader.source_arrays().values())
        assert blocks and all(isinstance(b, StepBlock) for b in blocks)
        for block in blocks:
            assert set(REQUIRED_STEP_KEYS) <= set(block.steps)
            n = block.num_steps
            assert all(len(col) == n for col in block.steps.values())
            ends = np.asarray(block.ends)
            assert np.all(np.diff(ends) > 0) and (ends.size == 0 or (ends[0] >= 0 and ends[-1] < n))
            assert all(len(col) == n + ends.size for col in block.observations.values())
            for extra in (block.final_known, block.episode_ids):
                assert extra is None or len(extra) == ends.size
        assert sum(b.num_steps for b in blocks) > 0
        assert sum(rows_seen) <= total or total == 0

    def test_a_window_of_episodes_reads_the_same_episodes(self, source: Path) -> None:
        """``select_episodes(1, 2)`` and the stream from the position it returns keep the episode
        the whole stream's selection keeps (``--episodes 1:2``); ``episode_files`` names files of
        the source, or ``None``."""
        with self.open(source) as reader:
            whole = list(select_blocks(reader.blocks(), episodes=(1, 2)))
        with self.open(source) as reader:
            start = reader.select_episodes(1, 2)
            files = reader.episode_files()
            window = list(select_blocks(reader.blocks(), episodes=(1, 2), start=start))
        assert files is None or all((source / f).is_file() for f in files)
        assert _joined(window).keys() == _joined(whole).keys()
        for key, value in _joined(whole).items():  # blocks may cut the stream elsewhere
            np.testing.assert_array_equal(_joined(window)[key], value, err_msg=key)


def _joined(blocks: list[StepBlock]) -> dict[str, np.ndarray]:
    """A stream's columns end to end, with its episodes' source ids and lengths."""
    out: dict[str, np.ndarray] = {}
    keys = {(k, "steps") for b in blocks for k in b.steps} | {
        (k, "observations") for b in blocks for k in b.observations
    }
    for key, side in sorted(keys):
        out[f"{side}:{key}"] = np.concatenate([np.asarray(getattr(b, side)[key]) for b in blocks])
    out["episode_ids"] = np.concatenate(
        [np.asarray(b.episode_ids, np.int64) for b in blocks if b.episode_ids is not None]
        or [np.zeros(0, np.int64)]
    )
    out["steps"] = np.array([b.num_steps for b in blocks]).sum(keepdims=True)
    out["episodes"] = np.array([len(b.ends) for b in blocks]).sum(keepdims=True)
    return out


#: (key, dtype, row shape): a scalar column, float vectors, bools, pixel frames, a nested key.
COLUMNS = (
    ("next/reward", np.float32, ()),
    ("observation", np.float32, (17,)),
    ("next/terminated", np.bool_, (1,)),
    ("pixels", np.uint8, (3, 8, 8)),
    ("info/deep/counter", np.int64, (2,)),
)
ROWS = 203
#: Appends of uneven sizes, one empty, so no chunk or shard edge lines up with one.
APPENDS = (1, 0, 50, 7, 100, 45)


def column_values(dtype: type, shape: tuple[int, ...], rows: int = ROWS) -> np.ndarray:
    # a seed that is the same in every process (hash() of a str is not)
    rng = np.random.default_rng(zlib.crc32(repr((np.dtype(dtype).str, shape)).encode()))
    if np.dtype(dtype) == np.bool_:
        return rng.random((rows, *shape)) < 0.3
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal((rows, *shape)).astype(dtype)
    return rng.integers(0, 200, (rows, *shape)).astype(dtype)


class BackendContract:
    """Tests every backend passes; subclasses implement :meth:`backend`."""

    def backend(self) -> Backend:
        raise NotImplementedError

    def write(self, where: Path, key: str, values: np.ndarray) -> None:
        writer = self.backend().create_column(where, key, values.dtype, values.shape[1:])
        start = 0
        for n in APPENDS:
            writer.append(values[start : start + n])
            start += n
        assert start == len(values)
        assert writer.close(fsync=False) == len(values)

    @pytest.mark.parametrize(("key", "dtype", "shape"), COLUMNS)
    def test_a_column_reads_back_exactly(
        self, tmp_path: Path, key: str, dtype: type, shape: tuple[int, ...]
    ) -> None:
        values = column_values(dtype, shape)
        self.write(tmp_path, key, values)
        column = self.backend().open_column(tmp_path, key)
        assert len(column) == ROWS and tuple(column.shape) == values.shape
        assert np.dtype(column.dtype) == values.dtype
        np.testing.assert_array_equal(np.asarray(column[:]), values)
        for sl in (slice(0, 1), slice(49, 58), slice(ROWS - 3, None), slice(2, ROWS, 9), slice(7, 7)):
            np.testing.assert_array_equal(np.asarray(column[sl]), values[sl], err_msg=str(sl))
        idx = np.array([[ROWS - 1, 0, 51], [51, 50, 100]])
        np.testing.assert_array_equal(np.asarray(column[idx]), values[idx])
        assert self.backend().check_column(tmp_path, key, ROWS, shape) is None

    @pytest.mark.parametrize(("key", "dtype", "shape"), COLUMNS)
    def test_read_column_reads_the_first_rows_into_ram(
        self, tmp_path: Path, key: str, dtype: type, shape: tuple[int, ...]
    ) -> None:
        values = column_values(dtype, shape)
        self.write(tmp_path, key, values)
        for stop in (ROWS, 51, 0):
            rows = self.backend().read_column(tmp_path, key, stop)
            assert isinstance(rows, np.ndarray) and not isinstance(rows, np.memmap)
            np.testing.assert_array_equal(rows, values[:stop])

    def test_read_column_of_a_missing_column_is_corrupt(self, tmp_path: Path) -> None:
        with pytest.raises(CorruptDatasetError):
            self.backend().read_column(tmp_path, "observation", 1)

    def test_a_missing_file_is_reported_by_check_column(self, tmp_path: Path) -> None:
        values = column_values(np.uint8, (3, 8, 8))
        self.write(tmp_path, "pixels", values)
        arrays = (tmp_path / "arrays").rglob("*")
        files = sorted(p for p in arrays if p.is_file() and p.name != "zarr.json")
        assert files
        files[-1].unlink()
        problem = self.backend().check_column(tmp_path, "pixels", ROWS, (3, 8, 8))
        if problem is None:  # a backend may only find it on reading, but then it must say so
            with pytest.raises(CorruptDatasetError):
                np.asarray(self.backend().open_column(tmp_path, "pixels")[:])
        else:
            assert "pixels" in problem or str(tmp_path) in problem

    def test_a_wrong_row_count_is_reported(self, tmp_path: Path) -> None:
        self.write(tmp_path, "observation", column_values(np.float32, (17,)))
        assert self.backend().check_column(tmp_path, "observation", ROWS + 1, (17,)) is not None

    @pytest.mark.parametrize("key", ["../escape", "/abs", "a//b", "a/./b", "sp ace", ""])
    def test_a_key_that_is_no_safe_path_is_refused_before_any_write(self, tmp_path: Path, key: str) -> None:
        with pytest.raises(InvalidKeyError):
            self.backend().create_column(tmp_path / "ds", key, np.dtype(np.float32), ())
        assert not [p for p in tmp_path.rglob("*") if p.is_file()], "a refused key wrote a file"

    # ------------------------------------------------------------------ regions

    def regions(self, dtype: type, shape: tuple[int, ...], rows: int = ROWS) -> list[tuple[int, int]]:
        """Aligned regions covering ``rows``, of uneven sizes where the alignment allows."""
        align = self.backend().region_rows(np.dtype(dtype), shape)
        assert align >= 1
        cuts = sorted({0, rows, *(c for c in (align, 3 * align, 4 * align, 10 * align) if c < rows)})
        return list(itertools.pairwise(cuts))

    @pytest.mark.parametrize(("key", "dtype", "shape"), COLUMNS)
    def test_regions_in_any_order_equal_an_appended_column_file_for_file(
        self, tmp_path: Path, key: str, dtype: type, shape: tuple[int, ...]
    ) -> None:
        values = column_values(dtype, shape)
        backend = self.backend()
        backend.preallocate(tmp_path / "regions", key, np.dtype(dtype), shape, ROWS)
        assert backend.check_preallocated(tmp_path / "regions", key, ROWS, shape) is None
        for start, stop in reversed(self.regions(dtype, shape)):
            region = backend.open_region(tmp_path / "regions", key, start, stop)
            assert region.rows.shape == (stop - start, *shape)
            region.rows[:] = values[start:stop]
            region.close(fsync=True)
        assert backend.check_column(tmp_path / "regions", key, ROWS, shape) is None
        np.testing.assert_array_equal(np.asarray(backend.open_column(tmp_path / "regions", key)[:]), values)
        self.write(tmp_path / "appended", key, values)
        files = {
            p.relative_to(tmp_path / "appended"): p.read_bytes()
            for p in sorted((tmp_path / "appended").rglob("*"))
            if p.is_file()
        }
        assert files
        for rel, data in files.items():
            assert (tmp_path / "regions" / rel).read_bytes() == data, rel

    def test_regions_of_zeros_write_every_file(self, tmp_path: Path) -> None:
        """A region equal to the fill value is stored too: a missing file reads as damage."""
        values = np.zeros((ROWS, 1), np.bool_)
        backend = self.backend()
        backend.preallocate(tmp_path / "regions", "done", values.dtype, (1,), ROWS)
        for start, stop in self.regions(np.bool_, (1,)):
            region = backend.open_region(tmp_path / "regions", "done", start, stop)
            region.rows[:] = values[start:stop]
            region.close(fsync=False)
        assert backend.check_column(tmp_path / "regions", "done", ROWS, (1,)) is None
        self.write(tmp_path / "appended", "done", values)
        for path in (tmp_path / "appended").rglob("*"):
            if path.is_file():
                rel = path.relative_to(tmp_path / "appended")
                assert (tmp_path / "regions" / rel).read_bytes() == path.read_bytes(), rel

    def test_a_preallocated_column_of_another_size_is_reported(self, tmp_path: Path) -> None:
        self.backend().preallocate(tmp_path, "observation", np.dtype(np.float32), (17,), ROWS)
        assert self.backend().check_preallocated(tmp_path, "observation", ROWS + 1, (17,)) is not None
        assert self.backend().check_preallocated(tmp_path, "action", ROWS, (17,)) is not None

    def test_a_region_outside_the_column_or_off_its_alignment_is_refused(self, tmp_path: Path) -> None:
        backend = self.backend()
        backend.preallocate(tmp_path, "pixels", np.dtype(np.uint8), (3, 8, 8), ROWS)
        with pytest.raises(ValueError, match="outside"):
            backend.open_region(tmp_path, "pixels", 0, ROWS + 1)
        align = backend.region_rows(np.dtype(np.uint8), (3, 8, 8))
        if align > 1 and align + 1 < ROWS:
            with pytest.raises(ValueError, match="aligned"):
                backend.open_region(tmp_path, "pixels", 1, ROWS)
            with pytest.raises(ValueError, match="aligned"):
                backend.open_region(tmp_path, "pixels", 0, align + 1)


class Stop(Exception):
    """Raised from ``progress`` to break an export off midway."""


class ExporterContract:
    """Tests every exporter passes; subclasses set :attr:`format`."""

    format: str
    #: Keys that read back under another name (the format's own naming), ours -> theirs.
    renamed: ClassVar[dict[str, str]] = {}
    #: Keys the format cannot hold (compared: every other key of the dataset).
    dropped: ClassVar[frozenset[str]] = frozenset()
    #: The format's options every export of the suite passes (``export_dataset(options=...)``).
    options: ClassVar[dict[str, object]] = {}

    def out_path(self, tmp_path: Path) -> Path:
        """Where the export goes (a file or a folder, as the format wants)."""
        return tmp_path / "out" / f"exported-{self.format}"

    @pytest.fixture
    def dataset(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dataset:
        """Three episodes of 3, 2 and 1 steps with an info key and a synthesized final observation,
        in a cache of their own under ``tmp_path``."""
        monkeypatch.setenv("RLDS_HOME", str(tmp_path / "rlds-home"))
        convert(golden_three_episodes(tmp_path / "g.hdf5", with_next=False), "g")
        return open_dataset("g")

    def test_what_it_writes_reads_back_as_the_dataset(self, dataset: Dataset, tmp_path: Path) -> None:
        out = export_dataset(dataset, self.out_path(tmp_path), self.format, options=self.options)
        convert(out, "back")
        back = open_dataset("back")
        assert back.episode_index["length"].tolist() == dataset.episode_index["length"].tolist()
        ours, theirs = dataset[:], back[:]
        for key in sorted(set(ours) - self.dropped):
            got = theirs[self.renamed.get(key, key)]
            want = ours[key]
            assert got.dtype == want.dtype, key
            np.testing.assert_array_equal(got.reshape(want.shape), want, err_msg=key)

    def test_an_existing_output_is_kept_unless_overwrite(self, dataset: Dataset, tmp_path: Path) -> None:
        """An earlier export (a folder export's, with a file of the user's added) stays without
        ``overwrite`` and is replaced whole with it; a file that does not begin as the format's
        files do is never replaced (``overwrite`` wrote over any file)."""
        out = self.out_path(tmp_path)
        export_dataset(dataset, out, self.format, options=self.options)
        mine = out / "mine.txt" if out.is_dir() else out
        earlier = None if out.is_dir() else out.read_bytes()
        mine.write_bytes(b"keep me")
        with pytest.raises(ExportError, match="already exists"):
            export_dataset(dataset, out, self.format, options=self.options)
        assert mine.read_bytes() == b"keep me"
        if earlier is not None:  # one file: not an export of the format any more
            with pytest.raises(ExportError, match="is a file that is no earlier export of this format"):
                export_dataset(dataset, out, self.format, overwrite=True, options=self.options)
            assert mine.read_bytes() == b"keep me"
            out.write_bytes(earlier)
        export_dataset(dataset, out, self.format, overwrite=True, options=self.options)
        assert out.exists() and (not mine.exists() if out.is_dir() else out.read_bytes() != b"keep me")

    def test_an_export_broken_off_leaves_nothing(self, dataset: Dataset, tmp_path: Path) -> None:
        out = self.out_path(tmp_path)
        out.parent.mkdir(parents=True, exist_ok=True)
        before = sorted(out.parent.rglob("*"))

        def stop(steps: int) -> None:
            raise Stop

        with pytest.raises(Stop):
            export_dataset(dataset, out, self.format, progress=stop, options=self.options)
        assert sorted(out.parent.rglob("*")) == before

    def test_progress_hears_of_every_step_once(self, dataset: Dataset, tmp_path: Path) -> None:
        calls: list[int] = []
        export_dataset(
            dataset, self.out_path(tmp_path), self.format, progress=calls.append, options=self.options
        )
        assert calls and all(n > 0 for n in calls)
        assert sum(calls) == dataset.num_steps


#: Episodes of mixed lengths, one of a single step: 62 steps.
SAMPLER_LENGTHS = (9, 1, 17, 4, 23, 8)


def indices(draw: Any) -> np.ndarray:
    """The step indices of a draw (masked-out padding left out)."""
    if isinstance(draw, Draw):
        idx = np.asarray(draw.indices)
        mask = draw.extras.get("mask")
        return idx[np.asarray(mask, bool)] if mask is not None else idx.ravel()
    return np.asarray(draw).ravel()


def as_arrays(draw: Any) -> dict[str, np.ndarray]:
    """Everything a draw holds, as arrays (to compare two draws exactly)."""
    if isinstance(draw, Draw):
        return {"index": np.asarray(draw.indices), **{k: np.asarray(v) for k, v in draw.extras.items()}}
    return {"index": np.asarray(draw)}


def assert_same_draws(a: list[Any], b: list[Any]) -> None:
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        ax, ay = as_arrays(x), as_arrays(y)
        assert ax.keys() == ay.keys(), f"draw {i}"
        for key in ax:
            np.testing.assert_array_equal(ax[key], ay[key], err_msg=f"draw {i}, {key}")


class SamplerContract:
    """Tests every sampler passes; subclasses implement :meth:`make`."""

    #: Draws taken by the stream tests.
    DRAWS = 12

    def make(self, episodes: Episodes, seed: int, rank: int = 0, world_size: int = 1) -> Sampler:
        raise NotImplementedError

    @pytest.fixture
    def episodes(self) -> Episodes:
        return Episodes(np.array(SAMPLER_LENGTHS))

    def draws(self, sampler: Sampler, n: int | None = None) -> list[Any]:
        return [sampler.sample() for _ in range(n or self.DRAWS)]

    def test_is_a_checkpointable_sampler(self, episodes: Episodes) -> None:
        sampler = self.make(episodes, 0)
        assert isinstance(sampler, Sampler) and isinstance(sampler, Checkpointable)

    def test_draws_int64_steps_of_the_dataset(self, episodes: Episodes) -> None:
        for draw in self.draws(self.make(episodes, 1)):
            idx = indices(draw)
            assert idx.dtype == np.int64 and idx.size > 0
            assert idx.min() >= 0 and idx.max() < episodes.num_steps

    def test_the_seed_fixes_the_stream(self, episodes: Episodes) -> None:
        assert_same_draws(self.draws(self.make(episodes, 5)), self.draws(self.make(episodes, 5)))
        a = np.concatenate([indices(d) for d in self.draws(self.make(episodes, 5))])
        b = np.concatenate([indices(d) for d in self.draws(self.make(episodes, 6))])
        assert not np.array_equal(a, b), "another seed, the same stream"

    @pytest.mark.parametrize("after", [0, 1, 5])
    def test_a_restored_state_continues_the_exact_stream(self, episodes: Episodes, after: int) -> None:
        sampler = self.make(episodes, 11)
        if after:
            self.draws(sampler, after)
        assert isinstance(sampler, Checkpointable)
        state = pickle.loads(pickle.dumps(sampler.state_dict()))  # a checkpoint goes through a file
        expected = self.draws(sampler)
        fresh = self.make(episodes, 999)  # another seed: everything must come from the state
        assert isinstance(fresh, Checkpointable)
        fresh.load_state_dict(state)
        assert_same_draws(self.draws(fresh), expected)

    def test_a_state_from_another_rank_or_world_size_is_refused(self, episodes: Episodes) -> None:
        saved = self.make(episodes, 3, rank=1, world_size=2)
        assert isinstance(saved, Checkpointable)
        state = saved.state_dict()
        for rank, world in ((0, 2), (1, 3), (0, 1)):
            other = self.make(episodes, 3, rank=rank, world_size=world)
            assert isinstance(other, Checkpointable)
            with pytest.raises(LoaderStateError):
                other.load_state_dict(state)

    def test_ranks_draw_different_streams(self, episodes: Episodes) -> None:
        a = np.concatenate([indices(d) for d in self.draws(self.make(episodes, 4, rank=0, world_size=2))])
        b = np.concatenate([indices(d) for d in self.draws(self.make(episodes, 4, rank=1, world_size=2))])
        assert not np.array_equal(a, b), "two ranks of one run drew the same stream"


class EpochalContract(SamplerContract):
    """For samplers without replacement: an epoch covers the rank's shard once; the ranks' shards
    are disjoint and cover the dataset."""

    def test_is_epochal(self, episodes: Episodes) -> None:
        assert isinstance(self.make(episodes, 0), Epochal)

    def test_ranks_cover_every_step_once_per_epoch(self, episodes: Episodes) -> None:
        seen: list[np.ndarray] = []
        for rank in range(2):
            sampler = self.make(episodes, 8, rank=rank, world_size=2)
            assert isinstance(sampler, Epochal)
            mine = [indices(sampler.sample()) for _ in range(sampler.batches_per_epoch)]
            assert sampler.epoch_done()
            seen.append(np.concatenate(mine))
        assert not set(seen[0].tolist()) & set(seen[1].tolist()), "two ranks drew the same step"
        assert sorted(np.concatenate(seen).tolist()) == list(range(episodes.num_steps))


class PrioritizedContract(SamplerContract):
    """For prioritized samplers: a step whose priority is set to zero is never drawn again."""

    def test_zero_priority_is_never_drawn(self, episodes: Episodes) -> None:
        sampler = self.make(episodes, 2)
        assert isinstance(sampler, Prioritized)
        muted = np.arange(0, episodes.num_steps, 2)
        sampler.update_priority(muted, np.zeros(len(muted)))
        drawn = np.concatenate([indices(d) for d in self.draws(sampler)])
        assert not set(drawn.tolist()) & set(muted.tolist())


FNS = "rlds_cli.testing.sources"
#: 120 steps in episodes of mixed lengths: 12 chunks of 10 steps.
EXECUTOR_LENGTHS = [7, 13, 1, 30, 9, 20, 40]
CHUNK = 10


class _Watched:
    """The executor under test, recording what it hands to ``on_done`` and whether it is closed."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.results: list[dict[str, Any]] = []
        self.tasks: list[Task] = []
        self.closed = False

    def run(self, spec: Mapping[str, Any], tasks: Sequence[Task], on_done: OnDone) -> None:
        self.tasks = list(tasks)

        def watch(result: dict[str, Any]) -> None:
            self.results.append(result)
            on_done(result)

        self.inner.run(spec, tasks, watch)

    def close(self) -> None:
        self.closed = True
        self.inner.close()


class ExecutorContract:
    """Tests every executor passes; subclasses set :attr:`name` (and :attr:`workers`)."""

    #: The executor's name in :data:`~rlds_cli.preprocess.executors.EXECUTORS`.
    name: str
    #: The job's ``workers``.
    workers: int | None = 2

    @pytest.fixture(autouse=True)
    def _own_cache(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Each test's datasets in a cache of their own (workers inherit the variable)."""
        monkeypatch.setenv("RLDS_HOME", str(tmp_path / "rlds-home"))

    @pytest.fixture
    def watched(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[_Watched]]:
        """Every executor the jobs start: ``self.name``'s, watched."""
        made: list[_Watched] = []
        start = executors.start

        def forced(name: str, **kwargs: Any) -> Executor:
            made.append(_Watched(start(self.name, **kwargs)))
            return made[-1]

        monkeypatch.setattr(executors, "start", forced)
        yield made
        assert all(w.closed for w in made)
        assert multiprocessing.active_children() == []

    def run(self, fn: str, out: str = "out") -> preprocess.PreprocessResult:
        return preprocess.run("src", f"{FNS}:{fn}", out, workers=self.workers, chunk_steps=CHUNK)

    def test_is_an_executor(self, watched: list[_Watched]) -> None:
        make_dataset("src", EXECUTOR_LENGTHS)
        self.run("identity")
        assert isinstance(watched[0].inner, Executor)

    def test_every_result_is_delivered_exactly_once(self, watched: list[_Watched]) -> None:
        make_dataset("src", EXECUTOR_LENGTHS)
        result = self.run("normalize")
        (w,) = watched
        delivered = sorted(r["i"] for r in w.results)
        assert delivered == sorted(t[0] for t in w.tasks) == list(range(result.num_chunks))
        assert all(r["ok"] for r in w.results)
        src, out = open_dataset("src")[:], open_dataset("out")[:]
        np.testing.assert_array_equal(out["observation"], (src["observation"] - 1.5) / 2.0)
        np.testing.assert_array_equal(out["next/reward"], src["next/reward"])

    def test_a_failing_user_function_is_reported_with_its_traceback(self, watched: list[_Watched]) -> None:
        make_dataset("src", EXECUTOR_LENGTHS)
        with pytest.raises(UserFunctionError) as info:
            self.run("raises")
        assert "ValueError: boom in user code" in info.value.message
        assert 'raise ValueError("boom in user code")' in info.value.user_traceback
        assert "executors.py" not in info.value.user_traceback  # rlds's own frames left out
        failed = [r for r in watched[0].results if not r["ok"]]
        assert len(failed) == 1  # the job stopped at the first failure it was told of
        with pytest.raises(DatasetNotFoundError):
            open_dataset("out")  # nothing published

    def test_on_done_raising_stops_the_job(
        self, watched: list[_Watched], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        make_dataset("src", EXECUTOR_LENGTHS)
        calls: list[int] = []
        start = executors.start

        class Stop(Exception):
            pass

        def stopping(name: str, **kwargs: Any) -> Executor:
            inner = start(name, **kwargs)

            class Stopping:
                def run(self, spec: Mapping[str, Any], tasks: Sequence[Task], on_done: OnDone) -> None:
                    def once(result: dict[str, Any]) -> None:
                        calls.append(result["i"])
                        raise Stop

                    inner.run(spec, tasks, once)

                def close(self) -> None:
                    inner.close()

            return Stopping()

        monkeypatch.setattr(executors, "start", stopping)
        with pytest.raises(Stop):
            self.run("identity")
        assert len(calls) == 1
