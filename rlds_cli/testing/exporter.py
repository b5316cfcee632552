"""The contract every exporter keeps: a base class of tests to subclass.

Subclass and set the format (of ``rlds_cli.export.EXPORTERS``; and the output path); one test per
promise of :func:`rlds_cli.export.export_dataset`: the output reads back (with rlds's readers) as
the dataset; an existing output is kept unless ``overwrite``; a failed export leaves nothing
beside the output; ``progress`` hears of every step exactly once.

Subclass ``ExporterContract`` in a ``test_*.py`` file::

    from rlds_cli.testing.exporter import ExporterContract

    class TestMyExporter(ExporterContract):
        format = "my-format"
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.errors import ExportError
from rlds_cli.export import export_dataset
from rlds_cli.sources.convert import convert
from rlds_cli.testing.sources import golden_three_episodes


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
        out = self.out_path(tmp_path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"keep me")
        with pytest.raises(ExportError, match="already exists"):
            export_dataset(dataset, out, self.format, options=self.options)
        assert out.read_bytes() == b"keep me"
        export_dataset(dataset, out, self.format, overwrite=True, options=self.options)
        assert out.exists() and (out.is_dir() or out.read_bytes() != b"keep me")

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
