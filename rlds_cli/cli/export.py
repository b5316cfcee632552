"""``rlds export``: write a cached dataset in another tool's format."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from rlds_cli.cli import _output
from rlds_cli.cli._errors import handle_errors
from rlds_cli.cli.options import JsonOption, QuietOption, RootOption, VerboseOption, force_option


@handle_errors
def export(
    name: Annotated[str, typer.Argument(help="Dataset name in the cache (or a registry id or alias).")],
    out: Annotated[Path, typer.Argument(help="File (d4rl, npz) or directory (torchrl, minari) to create.")],
    to: Annotated[
        str, typer.Option("--to", "-t", help="Target format: torchrl, d4rl, npz, minari, lerobot or amago.")
    ] = "torchrl",
    force: Annotated[bool, force_option("Replace OUT if it exists.")] = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Export a dataset to TorchRL (tensordict memmap), D4RL HDF5, npz or Minari.

    With -q only the path written is printed.
    """
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.export import export_dataset
    from rlds_cli.names import resolve_name

    dataset = open_dataset(resolve_name(name, root), root)
    path = export_dataset(dataset, out, to, overwrite=force)
    if json:
        _output.print_json({"name": name, "format": to, "path": str(path), "num_steps": dataset.num_steps})
    elif quiet:
        _output.console.print(Text(str(path)), soft_wrap=True)
    else:
        _output.console.print(
            f"exported {_output.escape(name)} ({dataset.num_steps:,} steps) as {to} to "
            f"{_output.escape(str(path))}",
            soft_wrap=True,
        )
