"""Source format readers, found by name through a lazy registry.

Each entry maps a format name to ``"module:Class"``; the module is imported only when that
format is used, so h5py and friends stay out of ``rlds --help``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from rlds_cli.errors import UnknownFormatError

READERS: dict[str, str] = {
    "d4rl": "rlds_cli.formats.d4rl:D4RLReader",
}


def known_formats() -> list[str]:
    """Names accepted by ``--format``."""
    return sorted(READERS)


def reader_class(format_name: str) -> Any:
    """The reader class registered for ``format_name``."""
    try:
        target = READERS[format_name]
    except KeyError:
        raise UnknownFormatError(
            f"unknown source format {format_name!r}",
            hint=f"known formats: {', '.join(known_formats())}",
        ) from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def detect_format(path: Path) -> str:
    """Guess the format of a local source from its layout.

    Raises:
        UnknownFormatError: Nothing matched; the message lists the known formats.
    """
    if path.is_file() and path.suffix.lower() in {".hdf5", ".h5"}:
        import h5py

        try:
            with h5py.File(path, "r") as f:
                # Any of D4RL's root datasets: a file missing one of them still goes to the
                # D4RL reader, whose error then names the missing key.
                if any(key in f for key in ("observations", "actions", "rewards", "terminals")):
                    return "d4rl"
        except OSError:
            return "d4rl"  # an HDF5 name that will not open: let the reader report why
    raise UnknownFormatError(
        f"cannot tell the format of {path}",
        hint=f"pass --format (known formats: {', '.join(known_formats())})",
    )
