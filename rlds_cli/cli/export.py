"""``rlds export``: write a cached dataset in another tool's format."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlds_cli.cli import _output
from rlds_cli.cli._errors import handle_errors
from rlds_cli.cli.options import JsonOption, QuietOption, RootOption, cached_name


@handle_errors
def export(
    name: Annotated[str, typer.Argument(help="Dataset name in the cache.")],
    out: Annotated[Path, typer.Argument(help="File (d4rl, npz) or directory (torchrl, minari) to create.")],
    to: Annotated[
        str, typer.Option("--to", "-t", help="Target format: torchrl, d4rl, npz or minari.")
    ] = "torchrl",
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")] = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Export a dataset to TorchRL (tensordict memmap), D4RL HDF5, npz or Minari."""
    from rlds_cli.cache.dataset import open_dataset
    from rlds_cli.export import export_dataset

    dataset = open_dataset(cached_name(name, root), root)
    path = export_dataset(dataset, out, to, overwrite=force)
    if json:
        _output.print_json({"name": name, "format": to, "path": str(path), "num_steps": dataset.num_steps})
    elif not quiet:
        _output.console.print(
            f"exported {_output.escape(name)} ({dataset.num_steps:,} steps) as {to} to "
            f"{_output.escape(str(path))}",
            soft_wrap=True,
        )
