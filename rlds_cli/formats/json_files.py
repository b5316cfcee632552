"""A source's JSON metadata file, read for a format reader: bounded, parsed, one error naming it.

LeRobot's ``info.json``, TFDS's ``features.json``, TensorDict's ``meta.json``, Minari's ``metadata.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlds_cli.errors import SourceFormatError

__all__ = ["MAX_JSON_BYTES", "check_json_size", "read_json_file"]

#: Largest JSON metadata file read (refused before any of it is read).
MAX_JSON_BYTES = 64 << 20


def check_json_size(path: Path, what: str = "metadata") -> None:
    """Refuse ``path`` where it is over :data:`MAX_JSON_BYTES`; ``what`` names it in the error.

    Raises:
        SourceFormatError: ``<path> is <n> bytes, over the <max> read for <what>``.
        OSError: ``path`` cannot be stat'ed.
    """
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise SourceFormatError(f"{path} is {size:,} bytes, over the {MAX_JSON_BYTES:,} read for {what}")


def read_json_file(path: Path, what: str = "metadata") -> Any:
    """The JSON file at ``path``, parsed (any JSON value: the caller checks its shape).

    Raises:
        SourceFormatError: It is over :data:`MAX_JSON_BYTES` (:func:`check_json_size`), or
            missing, unreadable, not UTF-8 or not JSON (``<path> is not readable JSON: <why>``).
    """
    try:
        check_json_size(path, what)
        return json.loads(path.read_text(encoding="utf-8"))
    except SourceFormatError:
        raise
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise SourceFormatError(f"{path} is not readable JSON: {exc}") from None
