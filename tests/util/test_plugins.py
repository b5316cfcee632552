"""The one resolver of the plug-point tables (formats, exporters, executors): a known name
imports its object, an unknown one is the table's own error listing the known names."""

from __future__ import annotations

import pytest

from rlds_cli._util.lazy import load, resolve
from rlds_cli.errors import PreprocessError, UnknownFormatError
from rlds_cli.export import EXPORTERS
from rlds_cli.formats import READERS, reader_class
from rlds_cli.preprocess.executors import EXECUTORS, start


@pytest.mark.parametrize("table", [READERS, EXPORTERS, EXECUTORS], ids=["readers", "exporters", "executors"])
def test_every_entry_of_every_table_resolves(table: dict[str, str]) -> None:
    for name, target in table.items():
        assert resolve(table, name, what="thing", error=UnknownFormatError) is load(target), name


def test_an_unknown_name_is_the_tables_error_with_the_known_names() -> None:
    with pytest.raises(UnknownFormatError, match="unknown export format 'parquet'") as info:
        resolve(EXPORTERS, "parquet", what="export format", error=UnknownFormatError)
    assert info.value.hint == f"known: {', '.join(sorted(EXPORTERS))}"
    with pytest.raises(UnknownFormatError, match="unknown source format 'nope'"):
        reader_class("nope")
    with pytest.raises(PreprocessError, match="unknown executor 'cluster'") as raised:
        start("cluster", workers=1, num_chunks=1)
    assert "local" in raised.value.hint and "ray" in raised.value.hint
