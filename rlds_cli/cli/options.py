"""Options shared by several commands, so every command spells them the same way.

The conventions (docs/cli.md, "Conventions"; tests/test_cli_conventions.py checks them over the
whole app): ``-h`` everywhere; ``--json``, ``-q`` and ``-v`` on every command; a new dataset's
name is ``--name/-n``; ``-f`` is ``--force``; ``--storage`` is memmap or zarr. Old spellings stay
as hidden, deprecated aliases for one release.
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
#: ``--backend/-b``: the old name of ``--storage`` (download, demo); hidden, deprecated.
LegacyBackendOption = Annotated[
    str | None, typer.Option("--backend", "-b", hidden=True, help="Deprecated: use --storage.")
]
#: The name of the dataset a command creates.
NameOption = Annotated[
    str | None, typer.Option("--name", "-n", help="Name of the new dataset in the cache.", show_default=False)
]


def force_option(help: str) -> Any:
    """``--force/-f`` with a command's own help text."""
    return typer.Option("--force", "-f", help=help)


def deprecated(old: str, new: str) -> None:
    """Say on stderr that an old spelling was used, when a person reads stderr (a terminal):
    scripts keep working, with output unchanged, until the spelling goes (next release)."""
    from rlds_cli.cli import _output

    if _output.err_console.is_terminal:
        _output.warn(f"{old} is deprecated and will be removed in the next release: use {new}")


def storage_choice(storage: str | None, legacy_backend: str | None, default: str = "memmap") -> str:
    """``--storage``, or the deprecated ``--backend`` spelling of it (with a warning)."""
    if legacy_backend is not None:
        deprecated("--backend", "--storage")
        if storage is not None and storage != legacy_backend:
            raise typer.BadParameter(
                f"--storage {storage} and --backend {legacy_backend} disagree (--backend is the old "
                "name of --storage: give only --storage)"
            )
        return legacy_backend
    return storage if storage is not None else default

