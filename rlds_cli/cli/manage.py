"""``rlds rm``, ``rlds du``, ``rlds gc`` and ``rlds path``: cache housekeeping."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.table import Table

from rlds_cli.cli import _output
from rlds_cli.cli._errors import handle_errors
from rlds_cli.cli.options import JsonOption, QuietOption, RootOption, cached_name


def _can_ask() -> bool:
    """Whether a person can answer a confirmation prompt."""
    return sys.stdin.isatty()


NameArgument = Annotated[str, typer.Argument(help="Dataset name in the cache.")]


@handle_errors
def rm(
    name: NameArgument,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Remove it even if other datasets were derived from it.")
    ] = False,
    root: RootOption = None,
    quiet: QuietOption = False,
) -> None:
    """Remove a dataset from the cache."""
    from rlds_cli.cache.manage import children_of, dataset_path, remove_dataset
    from rlds_cli.cache.root import CacheRoot

    cache = CacheRoot(root)
    path = dataset_path(cache, name)
    if not yes:
        if not _can_ask():
            _output.error(f"refusing to remove {name!r} without confirmation", "pass --yes")
            raise typer.Exit(1)
        children = children_of(cache, name)
        extra = f" (parent of {', '.join(children)})" if children else ""
        if not typer.confirm(f"remove {name}{extra} at {path}?", default=False):
            raise typer.Exit(1)
    remove_dataset(cache, name, force=force)
    if not quiet:
        _output.console.print(f"removed {_output.escape(name)}")


@handle_errors
def du(root: RootOption = None, json: JsonOption = False) -> None:
    """Show how much disk the cache uses, by dataset."""
    from rlds_cli.cache.manage import disk_usage
    from rlds_cli.cache.root import CacheRoot

    usage = disk_usage(CacheRoot(root))
    if json:
        _output.print_json(usage.to_dict())
        return
    table = Table(title=f"disk use of {_output.escape(str(usage.root))}", title_justify="left")
    table.add_column("what")
    table.add_column("size", justify="right")
    for name, size in sorted(usage.datasets.items(), key=lambda kv: -kv[1]):
        table.add_row(_output.escape(name), _output.human_bytes(size))
    for label, size in (
        ("(raw downloads)", usage.raw),
        ("(temporary builds)", usage.tmp),
        ("(other)", usage.other),
    ):
        if size:
            table.add_row(label, _output.human_bytes(size))
    table.add_row("[bold]total[/]", f"[bold]{_output.human_bytes(usage.total)}[/]")
    _output.console.print(table)


@handle_errors
def gc(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only show what would be removed.")] = False,
    jobs: Annotated[
        bool, typer.Option("--jobs", help="Also remove interrupted preprocess jobs (no --resume after).")
    ] = False,
    raw: Annotated[
        bool, typer.Option("--raw", help="Also remove downloaded files no cached dataset was converted from.")
    ] = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Remove leftovers of killed builds and unpublished directories."""
    from rlds_cli.cache.manage import collect_garbage
    from rlds_cli.cache.root import CacheRoot

    removed = collect_garbage(CacheRoot(root), dry_run=dry_run, jobs=jobs, raw=raw)
    if json:
        _output.print_json({"dry_run": dry_run, "removed": [str(p) for p in removed]})
        return
    if quiet:
        return
    verb = "would remove" if dry_run else "removed"
    for path in removed:
        _output.console.print(f"{verb} {_output.escape(str(path))}")
    if not removed:
        _output.console.print("nothing to remove")


@handle_errors
def path(name: NameArgument, root: RootOption = None) -> None:
    """Print the directory of a dataset (for scripts: `cd $(rlds path NAME)`)."""
    from rlds_cli.cache.manage import dataset_path
    from rlds_cli.cache.root import CacheRoot

    sys.stdout.write(f"{dataset_path(CacheRoot(root), cached_name(name, root))}\n")
