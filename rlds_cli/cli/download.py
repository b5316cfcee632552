"""``rlds download``."""

from __future__ import annotations

from typing import Annotated

import typer

from rlds_cli.cli import _output
from rlds_cli.cli._errors import handle_errors
from rlds_cli.cli.options import BackendOption, JsonOption, QuietOption, RootOption


@handle_errors
def download(
    source: Annotated[str, typer.Argument(help="A registry id or alias, or a local file path.")],
    name: Annotated[str | None, typer.Option("--name", "-n", help="Name in the cache.")] = None,
    format: Annotated[
        str | None, typer.Option("--format", "-f", help="Source format (default: detect).")
    ] = None,
    backend: BackendOption = "memmap",
    force: Annotated[
        bool, typer.Option("--force", help="Re-convert and replace an existing dataset.")
    ] = False,
    max_episode_steps: Annotated[
        int | None,
        typer.Option("--max-episode-steps", min=1, help="Time limit, for D4RL files without 'timeouts'."),
    ] = None,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Convert a dataset (registry id or local file) into the TED cache."""
    from rlds_cli.download import download as run_download

    with _output.conversion_progress(enabled=not (quiet or json)) as progress:
        result = run_download(
            source,
            name=name,
            format=format,
            root=root,
            backend=backend,
            force=force,
            options={"max_episode_steps": max_episode_steps},
            progress=progress,
        )
    m = result.manifest
    if json:
        _output.print_json(
            {
                "name": m.name,
                "path": str(result.path),
                "reused": result.reused,
                "num_steps": m.num_steps,
                "num_episodes": m.num_episodes,
                "backend": m.backend,
                "conversion": m.conversion,
            }
        )
        return
    if quiet:
        return
    for note in m.conversion.get("notes", []):
        _output.warn(note)
    if m.conversion.get("inferred_boundaries"):
        _output.warn(
            f"{m.conversion['inferred_boundaries']} episode boundaries were not flagged in the "
            "source and were inferred (see 'rlds inspect')"
        )
    verb = "already in the cache" if result.reused else "converted"
    _output.console.print(
        f"[green]{m.name}[/]: {verb}: {m.num_steps:,} steps, {m.num_episodes:,} episodes, "
        f"backend {m.backend} -> {_output.escape(str(result.path))}",
        soft_wrap=True,
    )
