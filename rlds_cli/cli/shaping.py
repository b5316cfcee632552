"""``rlds merge``, ``rlds drop``, ``rlds trim`` and ``rlds downsample``: datasets shaped from
others. Merge, drop and trim copy nothing (their datasets read their parents' arrays);
downsample writes the kept steps."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.text import Text

from rlds_cli.cli import output
from rlds_cli.cli.exits import handle_errors
from rlds_cli.cli.options import JsonOption, NameOption, QuietOption, RootOption, VerboseOption, force_option

ParentArgument = Annotated[str, typer.Argument(help="The dataset to derive from (or a registry alias).")]
ForceOption = Annotated[bool, force_option("Replace an existing dataset of the new name.")]


def _need_name(name: str | None) -> str:
    if name is None:
        raise typer.BadParameter("the new dataset's name is required", param_hint="'--name' / '-n'")
    return name


@handle_errors
def merge(
    datasets: Annotated[
        list[str], typer.Argument(help="Two or more datasets with the same schema, merged in this order.")
    ],
    name: NameOption = None,
    no_verify: Annotated[
        bool,
        typer.Option(
            "--no-verify", help="Skip checking the datasets' content digests first (they are read once)."
        ),
    ] = False,
    force: ForceOption = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Merge datasets end to end into a new one that shares their arrays (nothing is copied).

    The datasets need the same keys, shapes, dtypes and codecs; their digests are checked first
    (--no-verify skips that). The parents cannot be removed while the merged dataset exists.

    Example: rlds merge hopper-a hopper-b --name hopper-ab
    """
    from rlds_cli.cache.compose import merge_datasets
    from rlds_cli.catalog.names import resolve_name

    new = _need_name(name)
    parents = [resolve_name(d, root) for d in datasets]
    manifest = merge_datasets(parents, new, root=root, replace=force, verify=not no_verify)
    for conflict in manifest.card.get("license_conflicts", []):  # made, but the user should know
        output.warn(f"licences: {conflict}")
    _report(manifest, "merged from " + ", ".join(parents), json=json, quiet=quiet)


@handle_errors
def drop(
    parent: ParentArgument,
    episodes: Annotated[
        str,
        typer.Option(
            "--episodes", "-e", help="Episodes to drop: numbers and runs A-B (inclusive), e.g. 0,5,9-20."
        ),
    ],
    name: NameOption = None,
    force: ForceOption = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Make a dataset without some episodes: a view of the others (nothing is copied).

    Example: rlds drop hopper-medium-v2 --episodes 0,5,9-20 --name hopper-clean
    """
    from rlds_cli.cache.drop import drop_episodes
    from rlds_cli.cache.episode_select import parse_episode_list
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.catalog.names import resolve_name

    new = _need_name(name)
    parent = resolve_name(parent, root)
    ids = parse_episode_list(episodes, open_dataset(parent, root).num_episodes)
    manifest = drop_episodes(parent, ids, new, root=root, replace=force)
    _report(
        manifest, f"{parent} without {len(ids)} episode{'s' if len(ids) != 1 else ''}", json=json, quiet=quiet
    )


@handle_errors
def trim(
    parent: ParentArgument,
    start: Annotated[int, typer.Option("--start", help="Steps cut at the start of each episode.", min=0)] = 0,
    end: Annotated[int, typer.Option("--end", help="Steps cut at the end of each episode.", min=0)] = 0,
    name: NameOption = None,
    force: ForceOption = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Cut steps at the start and end of each episode (nothing is copied).

    An episode cut at its end ends truncated; an episode of --start + --end steps or fewer is
    left out.

    Example: rlds trim pusht --start 5 --end 10 --name pusht-trimmed
    """
    from rlds_cli.cache.compose import trim_dataset
    from rlds_cli.catalog.names import resolve_name

    new = _need_name(name)
    parent = resolve_name(parent, root)
    manifest = trim_dataset(parent, new, start=start, end=end, root=root, replace=force)
    short = int(manifest.source.get("dropped_short", 0))
    note = f", {short} episode{'s' if short != 1 else ''} too short left out" if short else ""
    _report(
        manifest,
        f"{parent} cut by {start} steps at the start and {end} at the end{note}",
        json=json,
        quiet=quiet,
    )


@handle_errors
def downsample(
    parent: ParentArgument,
    every: Annotated[
        int, typer.Option("--every", "-k", help="Keep every k-th step of each episode (k >= 2).")
    ],
    name: NameOption = None,
    force: ForceOption = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Keep every k-th step of each episode, rewards summed over the steps skipped (a new dataset).

    Done flags stay on each episode's last step, and each step's next observation is the one
    after the steps it covers.

    Example: rlds downsample aloha-sim --every 2 --name aloha-sim-25hz
    """
    from rlds_cli.cache.downsample import downsample_dataset
    from rlds_cli.catalog.names import resolve_name

    new = _need_name(name)
    parent = resolve_name(parent, root)
    manifest = downsample_dataset(parent, new, every, root=root, replace=force)
    _report(manifest, f"one step in {every} of {parent}", json=json, quiet=quiet, shared=False)


def _report(manifest: Any, what: str, *, json: bool, quiet: bool, shared: bool = True) -> None:
    row = {
        "name": manifest.name,
        "parents": [p["name"] for p in manifest.lineage],
        "layout": manifest.layout,
        "num_steps": manifest.num_steps,
        "num_episodes": manifest.num_episodes,
    }
    if json:
        output.print_json(row)
    elif quiet:
        output.console.print(Text(manifest.name), soft_wrap=True)
    else:
        how = "sharing its parents' arrays" if shared else "written"
        output.console.print(
            f"[green]{output.escape(manifest.name)}[/]: {output.escape(what)} "
            f"({manifest.num_episodes:,} episodes, {manifest.num_steps:,} steps), {how}",
            soft_wrap=True,
        )
