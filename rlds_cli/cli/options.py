"""Options shared by several commands, so every command spells them the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

RootOption = Annotated[
    Path | None,
    typer.Option(
        "--root", help="Cache root (default: $RLDS_HOME, else the user cache dir).", show_default=False
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")]
BackendOption = Annotated[
    str, typer.Option("--backend", "-b", help="Storage backend of the cache: memmap or zarr.")
]


def cached_name(name: str, root: Path | None) -> str:
    """The cache name ``name`` refers to: itself when cached, else, for a registry id or alias
    (``rlds inspect demo``), the name ``rlds download`` gives that entry."""
    from rlds_cli import registry
    from rlds_cli.cache.root import CacheRoot
    from rlds_cli.errors import RldsError

    cache = CacheRoot(root)
    try:
        if cache.exists(name):
            return name
        alias = registry.resolve(name).cache_name
    except RldsError:
        return name
    return alias if cache.exists(alias) else name
