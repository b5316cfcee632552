"""The contract every source reader keeps: a base class of tests to subclass.

Subclass, set the reader class and implement :meth:`ReaderContract.write_source` (a small source
of the format); one test per promise of :class:`rlds_cli.formats.base.Reader`.

For a reader added through the ``rlds_cli.readers`` entry-point group, subclass
``ReaderContract`` in a ``test_*.py`` file::

    from rlds_cli.testing.reader import ReaderContract


    class TestMyReader(ReaderContract):
        reader_cls = MyReader

        def write_source(self, tmp_path):
            return write_my_file(tmp_path / "x.my")
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlds_cli.formats import detect_format, reader_class
from rlds_cli.formats.base import REQUIRED_STEP_KEYS, Reader, StepBlock, parse_options
from rlds_cli.formats.select import select_blocks
from rlds_cli.testing.sources import ogbench_file


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
