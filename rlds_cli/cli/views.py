"""Datasets derived from others: ``rlds view``, ``split``, ``merge``, ``drop`` and ``trim`` (they
copy nothing: they read their parents' arrays) and ``rlds downsample`` (it writes the kept steps)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from rlds_cli.cli import output
from rlds_cli.cli.output import (
    JsonOption,
    NameOption,
    QuietOption,
    RequiredNameOption,
    RootOption,
    VerboseOption,
    force_option,
    handle_errors,
)


def _check_fraction(value: float | None) -> float | None:
    if value is not None and not 0.0 < value < 1.0:
        raise typer.BadParameter(f"{value} is not between 0 and 1 (a fraction of the episodes, e.g. 0.1)")
    return value


ParentArgument = Annotated[str, typer.Argument(help="The dataset to derive from (or a registry alias).")]
ForceOption = Annotated[bool, force_option("Replace existing datasets of the new names.")]


@handle_errors
def view(
    parent: ParentArgument,
    name: NameOption = None,
    episodes: Annotated[
        str | None,
        typer.Option(
            "--episodes",
            "-e",
            help="Episodes: a range A:B (Python slice rules) or a list of positions and ranges, e.g. "
            "0,5,9-20 (inclusive; negative positions count from the end).",
            show_default=False,
        ),
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(
            "--where",
            "-w",
            help='Keep the episodes for which a predicate holds, e.g. "length >= 50 and return > 100" '
            "(columns of the episode table: length, return, start, source_id, episode...; "
            "with --episodes: among those).",
            show_default=False,
        ),
    ] = None,
    filter_key: Annotated[
        str | None,
        typer.Option(
            "--filter-key",
            help="The episodes of one of the dataset's filter keys (robomimic's mask/<key>, e.g. train).",
            show_default=False,
        ),
    ] = None,
    force: ForceOption = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Create a view of any episodes of a dataset, or of a filter key's episodes (no data is
    copied).

    Example: rlds view hopper-medium-v2 --episodes 0,5,9-20 --name hopper-some
    """
    import numpy as np

    from rlds_cli.cache.compose import verify_parent
    from rlds_cli.cache.derive import create_selection, create_view, filter_key_episodes
    from rlds_cli.cache.episode_table import STEP_KEYS_READ, parse_episode_list, select_where
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.cache.views import parse_episode_range
    from rlds_cli.catalog.registry import resolve_name
    from rlds_cli.errors import InvalidSelectionError

    if name is None:
        raise typer.BadParameter("the new view's name is required", param_hint="'--name' / '-n'")
    if episodes is None and where is None and filter_key is None:
        raise typer.BadParameter(
            "say which episodes: --episodes 0:100 or 0,5,9-20, --where PREDICATE or --filter-key KEY",
            param_hint="'--episodes' / '--where' / '--filter-key'",
        )
    parent = resolve_name(parent, root)
    ds = open_dataset(parent, root)
    if (
        episodes is not None
        and ":" in episodes
        and "," not in episodes
        and where is None
        and filter_key is None
    ):
        manifest = create_view(
            parent, name, parse_episode_range(episodes, ds.num_episodes), root=root, replace=force
        )
        _report([manifest], json=json, quiet=quiet, many=False, forced_in=(root, force))
        return
    how: list[str] = []
    ids = None
    if episodes is not None:
        ids = parse_episode_list(episodes, ds.num_episodes)
        how.append(f"episodes {episodes}")
    if filter_key is not None:
        keyed = filter_key_episodes(ds, filter_key)
        ids = keyed if ids is None else np.intersect1d(ids, keyed)
        how.append(f"filter key {filter_key!r}")
    if where is not None:  # chosen by the data: the data it reads must be undamaged
        verify_parent(ds, keys=STEP_KEYS_READ)
        matching = select_where(where, ds.episodes)
        among = f" among {', '.join(how)}" if how else ""
        ids = matching if ids is None else np.intersect1d(ids, matching)
        how.append(f"where {where}")
        if len(ids) == 0:
            raise InvalidSelectionError(
                f"--where {where!r} holds for no episode of {parent!r}{among}",
                hint="look at the episodes' statistics with 'rlds inspect'",
            )
    assert ids is not None
    if len(ids) == 0:
        raise InvalidSelectionError(f"no episode of {parent!r} is in all of: {', '.join(how)}")
    manifest = create_selection(parent, name, ids, how=", ".join(how), root=root, replace=force)
    _report([manifest], json=json, quiet=quiet, many=False, forced_in=(root, force))


@handle_errors
def split(
    parent: ParentArgument,
    val: Annotated[
        float | None,
        typer.Option(
            "--val",
            help="Fraction of episodes for validation, between 0 and 1 (e.g. 0.1): drawn at random "
            "(--seed), or the last ones (--last).",
            callback=_check_fraction,
            show_default=False,
        ),
    ] = None,
    val_episodes: Annotated[
        str | None,
        typer.Option(
            "--val-episodes",
            help="The validation episodes themselves instead of --val: positions and ranges, e.g. "
            "0,5,9-20, or one range A:B (the others are for training).",
            show_default=False,
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            "-n",
            help="Base of the new names: NAME-train and NAME-val (default: PARENT).",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        int,
        typer.Option(
            "--seed",
            help="Seed of the random draw of the validation episodes (the same seed, the same split).",
            min=0,
        ),
    ] = 0,
    last: Annotated[
        bool,
        typer.Option("--last", help="Take the last episodes for validation instead (a split in time)."),
    ] = False,
    force: ForceOption = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Split a dataset by episode into train and validation views (no data is copied).

    The validation episodes are drawn at random (--seed, 0 by default: the same split every
    time), so a dataset ordered by time or by policy is split evenly; --last takes the last
    ones; --val-episodes names them. Neither view is made when either name is taken (unless
    --force). With --force the two views replace the old two together: a split killed midway
    leaves the old pair, or some of the new views with the others missing (run it again), never
    one view of each split.
    """
    from rlds_cli.cache.derive import split_dataset
    from rlds_cli.catalog.registry import resolve_name

    parent = resolve_name(parent, root)
    base = name if name is not None else parent
    if (val is None) == (val_episodes is None):
        raise typer.BadParameter(
            "give either --val FRACTION or --val-episodes LIST", param_hint="'--val' / '--val-episodes'"
        )
    if val_episodes is not None and last:
        raise typer.BadParameter("--last picks episodes for --val, not --val-episodes", param_hint="'--last'")
    manifests = split_dataset(
        parent,
        val,
        val_episodes=val_episodes,
        train_name=f"{base}-train",
        val_name=f"{base}-val",
        root=root,
        replace=force,
        seed=seed,
        last=last,
    )
    _report(list(manifests), json=json, quiet=quiet, many=True, forced_in=(root, force))


def _report(
    manifests: list[Any], *, json: bool, quiet: bool, many: bool, forced_in: tuple[Path | None, bool]
) -> None:
    """Show the views made; ``forced_in``: the cache root, and whether --force may have replaced
    datasets of their names there (then the datasets made from the old ones are named)."""
    if forced_in[1]:
        for m in manifests:
            output.warn_stale_children(forced_in[0], m.name)
    rows = [
        {
            "name": m.name,
            "parent": m.source["parent"],
            "episodes": m.source["episodes"],
            **({"selection": m.source["selection"]} if m.source.get("selection") else {}),
            # a selection's own episodes ("episodes" is then only the span they lie in)
            **({"episode_ids": m.source["episode_ids"]} if m.source.get("episode_ids") is not None else {}),
            "num_steps": m.num_steps,
            "num_episodes": m.num_episodes,
        }
        for m in manifests
    ]
    if json:
        output.print_json(rows if many else rows[0])
    elif quiet:
        for r in rows:
            output.console.print(Text(r["name"]), soft_wrap=True)
    else:
        for r in rows:
            a, b = r["episodes"]
            chosen = output.escape(r.get("selection") or f"episodes {a}:{b}")
            output.console.print(
                f"[green]{output.escape(r['name'])}[/]: {chosen} of {output.escape(r['parent'])} "
                f"({output.count(r['num_episodes'], 'episode')}, {output.count(r['num_steps'], 'step')}), "
                "sharing its arrays",
                soft_wrap=True,
            )


ForceOneOption = Annotated[bool, force_option("Replace an existing dataset of the new name.")]


@handle_errors
def merge(
    datasets: Annotated[
        list[str], typer.Argument(help="Two or more datasets with the same schema, merged in this order.")
    ],
    name: RequiredNameOption,
    no_verify: Annotated[
        bool,
        typer.Option(
            "--no-verify", help="Skip checking the datasets' content digests first (they are read once)."
        ),
    ] = False,
    force: ForceOneOption = False,
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
    from rlds_cli.catalog.registry import resolve_name

    parents = [resolve_name(d, root) for d in datasets]
    manifest = merge_datasets(parents, name, root=root, replace=force, verify=not no_verify)
    for conflict in manifest.card.get("license_conflicts", []):  # made, but the user should know
        output.warn(f"licences: {conflict}")
    _report_shaped(
        manifest,
        "merged from " + ", ".join(parents),
        json=json,
        quiet=quiet,
        forced_in=(root, force),
    )


@handle_errors
def drop(
    parent: ParentArgument,
    episodes: Annotated[
        str,
        typer.Option(
            "--episodes",
            "-e",
            help="Episodes to drop: numbers and runs A-B (inclusive), e.g. 0,5,9-20, or one range A:B "
            "(Python slice rules).",
        ),
    ],
    name: RequiredNameOption,
    force: ForceOneOption = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Make a dataset without some episodes: a view of the others (nothing is copied).

    Example: rlds drop hopper-medium-v2 --episodes 0,5,9-20 --name hopper-clean
    """
    from rlds_cli.cache.derive import drop_episodes
    from rlds_cli.cache.episode_table import parse_episode_list
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.catalog.registry import resolve_name

    parent = resolve_name(parent, root)
    ids = parse_episode_list(episodes, open_dataset(parent, root).num_episodes)
    manifest = drop_episodes(parent, ids, name, root=root, replace=force)
    _report_shaped(
        manifest,
        f"{parent} without {len(ids)} episode{'s' if len(ids) != 1 else ''}",
        json=json,
        quiet=quiet,
        forced_in=(root, force),
    )


@handle_errors
def trim(
    parent: ParentArgument,
    name: RequiredNameOption,
    start: Annotated[int, typer.Option("--start", help="Steps cut at the start of each episode.", min=0)] = 0,
    end: Annotated[int, typer.Option("--end", help="Steps cut at the end of each episode.", min=0)] = 0,
    force: ForceOneOption = False,
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
    from rlds_cli.catalog.registry import resolve_name

    parent = resolve_name(parent, root)
    manifest = trim_dataset(parent, name, start=start, end=end, root=root, replace=force)
    short = int(manifest.source.get("dropped_short", 0))
    note = f", {short} episode{'s' if short != 1 else ''} too short left out" if short else ""
    _report_shaped(
        manifest,
        f"{parent} cut by {start} steps at the start and {end} at the end{note}",
        json=json,
        quiet=quiet,
        forced_in=(root, force),
    )


@handle_errors
def downsample(
    parent: ParentArgument,
    every: Annotated[
        int, typer.Option("--every", "-k", help="Keep every k-th step of each episode (k >= 2).")
    ],
    name: RequiredNameOption,
    force: ForceOneOption = False,
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
    from rlds_cli.cache.compose import downsample_dataset
    from rlds_cli.catalog.registry import resolve_name

    parent = resolve_name(parent, root)
    manifest = downsample_dataset(parent, name, every, root=root, replace=force)
    _report_shaped(
        manifest,
        f"one step in {every} of {parent}",
        json=json,
        quiet=quiet,
        forced_in=(root, force),
        shared=False,
    )


def _report_shaped(
    manifest: Any,
    what: str,
    *,
    json: bool,
    quiet: bool,
    forced_in: tuple[Path | None, bool],
    shared: bool = True,
) -> None:
    """Show the dataset made (``forced_in``: as :func:`_report`'s)."""
    if forced_in[1]:
        output.warn_stale_children(forced_in[0], manifest.name)
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
            f"({output.count(manifest.num_episodes, 'episode')}, "
            f"{output.count(manifest.num_steps, 'step')}), {how}",
            soft_wrap=True,
        )
