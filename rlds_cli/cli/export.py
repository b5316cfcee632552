"""``rlds export``: write a cached dataset in another tool's format."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from rlds_cli.cli import output
from rlds_cli.cli.options import JsonOption, QuietOption, RootOption, VerboseOption, force_option
from rlds_cli.cli.output import handle_errors


@handle_errors
def export(
    name: Annotated[str, typer.Argument(help="Dataset name in the cache (or a registry id or alias).")],
    out: Annotated[
        str,
        typer.Argument(
            help="File (d4rl, npz) or directory (torchrl, minari, lerobot, amago, rlds) to create, or "
            "(lerobot) a Hub dataset repo folder hf://datasets/ORG/REPO[/PATH][@BRANCH], committed in one "
            "commit."
        ),
    ],
    to: Annotated[
        str,
        typer.Option(
            "--to", "-t", help="Target format: torchrl, d4rl, npz, minari, lerobot, amago, robomimic or rlds."
        ),
    ] = "torchrl",
    lerobot_version: Annotated[
        str | None,
        typer.Option(
            "--lerobot-version",
            help="LeRobot layout written by --to lerobot: 3.0 (default; lerobot 0.4) or 2.1 (per-episode "
            "files, as GR00T and openpi read).",
        ),
    ] = None,
    image_codec: Annotated[
        str | None,
        typer.Option(
            "--image-codec",
            help="--to rlds: how uint8 HxWxC observations not stored as JPEG/PNG are written: png "
            "(default, lossless), jpeg or none (raw tensors).",
        ),
    ] = None,
    force: Annotated[bool, force_option("Replace OUT if it exists (on the Hub: another export).")] = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Export a dataset to TorchRL (tensordict memmap), D4RL HDF5, npz, Minari, LeRobot, AMAGO,
    robomimic HDF5 or RLDS.

    RLDS (--to rlds): TFRecord shards with features.json and dataset_info.json, what
    tfds.builder_from_directory loads (Octo, OpenVLA), written without TensorFlow. LeRobot
    (--to lerobot): v3.0, or v2.1 with --lerobot-version 2.1.

    To a Hugging Face Hub dataset repo (--to lerobot, OUT hf://datasets/ORG/REPO[/PATH], the repo
    made first): the export is written in the cache's tmp/ folder, then its files are one commit,
    so the repo shows all of it or nothing; only changed files are sent, and an unchanged export
    sends nothing. The token comes from HF_TOKEN or `hf auth login`.

    With -q only the path (or URL) written is printed.
    """
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.catalog.names import resolve_name
    from rlds_cli.errors import ExportError
    from rlds_cli.export import export_dataset

    options: dict[str, Any] = {}
    for flag, value, fmt, option in (
        ("--lerobot-version", lerobot_version, "lerobot", "version"),
        ("--image-codec", image_codec, "rlds", "image_codec"),
    ):
        if value is None:
            continue
        if to != fmt:
            raise ExportError(f"{flag} is an option of --to {fmt}, not of --to {to}")
        options[option] = value
    dataset = open_dataset(resolve_name(name, root), root)
    if out.startswith("hf://"):
        _export_to_hub(
            dataset, name, out, to, root=root, force=force, json=json, quiet=quiet, options=options
        )
        return
    path = export_dataset(dataset, Path(out), to, overwrite=force, options=options)
    if json:
        output.print_json({"name": name, "format": to, "path": str(path), "num_steps": dataset.num_steps})
    elif quiet:
        output.console.print(Text(str(path)), soft_wrap=True)
    else:
        output.console.print(
            f"exported {output.escape(name)} ({dataset.num_steps:,} steps) as {to} to "
            f"{output.escape(str(path))}",
            soft_wrap=True,
        )


def _export_to_hub(
    dataset: Any,
    name: str,
    url: str,
    to: str,
    *,
    root: Any,
    force: bool,
    json: bool,
    quiet: bool,
    options: dict[str, Any],
) -> None:
    """``rlds export NAME hf://...``: export, commit, then say what was sent."""
    from rlds_cli.export.hub import export_to_hub

    result = export_to_hub(dataset, url, to, root=root, force=force, options=options)
    if json:
        output.print_json(result.to_dict())
    elif quiet:
        output.console.print(Text(url), soft_wrap=True)
    elif result.up_to_date:
        output.console.print(
            f"[green]{output.escape(name)}[/]: this {to} export is already at {output.escape(url)} "
            f"({result.files} files): nothing to upload",
            soft_wrap=True,
        )
    else:
        replaced = "; the previous export was replaced" if result.replaced else ""
        output.console.print(
            f"exported {output.escape(name)} ({result.num_steps:,} steps) as {to} to {output.escape(url)}: "
            f"{result.uploaded} of {result.files} files, {output.human_bytes(result.bytes_uploaded)} "
            f"uploaded in one commit{replaced}",
            soft_wrap=True,
        )
