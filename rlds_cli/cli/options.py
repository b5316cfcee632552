"""Options shared by several commands, so every command spells them the same way.

The conventions (docs/cli.md, "Conventions"; tests/cli/test_cli_conventions.py checks them over the
whole app): ``-h`` everywhere; ``--json``, ``-q`` and ``-v`` on every command; a new dataset's
name is ``--name/-n``; ``-f`` is ``--force``; ``--storage`` is memmap or zarr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

RootOption = Annotated[
    Path | None,
    typer.Option(
        "--root", help="Cache root (default: $RLDS_HOME, else the user cache dir).", show_default=False
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of text.")]
QuietOption = Annotated[
    bool,
    typer.Option(
        "--quiet",
        "-q",
        help="Print only the names (or paths) the command lists, creates or removes, one per line.",
    ),
]
VerboseOption = Annotated[
    int,
    typer.Option(
        "--verbose", "-v", count=True, show_default=False, help="Log what happens (-v: info, -vv: debug)."
    ),
]
StorageOption = Annotated[
    str | None,
    typer.Option(
        "--storage", help="Storage of the new dataset: memmap (default) or zarr.", show_default=False
    ),
]
#: What a conversion does with camera frames (rlds_cli.frames.modes).
FramesOption = Annotated[
    str | None,
    typer.Option(
        "--frames",
        metavar="MODE",
        help="Camera frames: keep (default: frames that arrive encoded keep their bytes, arrays stay "
        "arrays), raw (decode all), jpeg[:QUALITY] (default 93), png or webp (lossless): encode arrays.",
        show_default=False,
    ),
]
#: The name of the dataset a command creates.
NameOption = Annotated[
    str | None, typer.Option("--name", "-n", help="Name of the new dataset in the cache.", show_default=False)
]


def force_option(help: str) -> Any:
    """``--force/-f`` with a command's own help text."""
    return typer.Option("--force", "-f", help=help)
