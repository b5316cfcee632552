"""The formats' one read of a JSON metadata file (rlds_cli/formats/untrusted.py): parsed when it
is JSON, else one SourceFormatError naming the file, and refused before reading when over the cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats import untrusted as json_files
from rlds_cli.formats.untrusted import check_json_size, read_json_file


def test_a_json_file_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "info.json"
    path.write_text('{"codebase_version": "v3.0", "fps": 30}', encoding="utf-8")
    assert read_json_file(path) == {"codebase_version": "v3.0", "fps": 30}


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"{not json", "Expecting property name"), (b'{"a": "\xff"}', "utf-8"), (None, "No such file")],
)
def test_what_is_not_json_is_one_error_naming_the_file(
    tmp_path: Path, content: bytes | None, reason: str
) -> None:
    path = tmp_path / "meta.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SourceFormatError) as info:
        read_json_file(path)
    assert str(info.value).startswith(f"{path} is not readable JSON: ") and reason in str(info.value)


def test_a_file_over_the_cap_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "features.json"
    path.write_text("[" + "0, " * 10 + "0]", encoding="utf-8")
    monkeypatch.setattr(json_files, "MAX_JSON_BYTES", 10)
    monkeypatch.setattr(Path, "read_text", lambda *a, **k: pytest.fail("read past the cap"))
    with pytest.raises(SourceFormatError, match=rf"(?m)^{path} is 33 bytes, over the 10 read for features$"):
        read_json_file(path, "features")
    with pytest.raises(SourceFormatError, match=r"(?m)is 33 bytes, over the 10 read for metadata$"):
        check_json_size(path)
