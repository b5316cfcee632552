"""``rlds rm``, ``rlds du``, ``rlds gc``, ``rlds path`` and ``rlds compact``: cache housekeeping
(``compact`` merges a growing dataset's segments: :mod:`rlds_cli.write.compact`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rlds_cli.cli import output
from rlds_cli.cli.output import (
    JsonOption,
    QuietOption,
    RootOption,
    VerboseOption,
    force_option,
    handle_errors,
)

if TYPE_CHECKING:
    from rlds_cli.cache.root import CacheRoot


def _can_ask() -> bool:
    """Whether a person can answer a confirmation prompt."""
    return sys.stdin.isatty()


NameArgument = Annotated[str, typer.Argument(help="Dataset name in the cache (or a registry id or alias).")]


@handle_errors
def rm(
    names: Annotated[
        list[str],
        typer.Argument(
            help="Datasets to remove (names in the cache, or registry ids or aliases).", metavar="NAME"
        ),
    ],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    force: Annotated[
        bool, force_option("Remove them even if other datasets were derived from them.")
    ] = False,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw", help="Also remove the downloaded files they came from (unless others use them)."
        ),
    ] = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Remove datasets from the cache.

    Everything is checked before anything is asked or removed: unknown names and datasets that
    others were derived from (without --force) stop the command with nothing removed. Answering
    no removes nothing, says so and exits 1. The downloaded files a dataset was converted from
    are kept (a re-conversion needs no download) unless --raw is given; the command says where
    they are and how much they take.
    """
    from rlds_cli.cache.manage import plan_removal, remove_datasets, tree_bytes
    from rlds_cli.cache.root import CacheRoot
    from rlds_cli.catalog.registry import resolve_name

    cache = CacheRoot(root)
    # unknown names and datasets in use stop here, before anything is asked or removed
    plan = plan_removal(cache, [resolve_name(n, cache) for n in names], force=force)
    targets = plan.targets
    if not yes:
        if not _can_ask():
            listed = ", ".join(repr(n) for n in targets)
            output.error(f"refusing to remove {listed} without confirmation", "pass --yes")
            raise typer.Exit(1)
        extra = " and their downloaded files" if raw and any(plan.raw_folders.values()) else ""
        what = ", ".join(targets)
        if not typer.confirm(f"remove {what}{extra} from {cache.path}?", default=False, err=True):
            output.note(f"kept {what}: nothing was removed")
            raise typer.Exit(1)
    result = remove_datasets(cache, plan, force=force, raw=raw)
    removed_raw, kept_raw = result.removed_raw, result.kept_raw
    if json:
        output.print_json(
            {
                "removed": targets,
                "removed_raw": [str(f) for f in removed_raw],
                "kept_raw": [str(f) for f in kept_raw],
            }
        )
        return
    if quiet:
        for name in targets:
            output.console.print(name, markup=False, soft_wrap=True)
        return
    for name in targets:
        output.console.print(f"removed {output.escape(name)}", soft_wrap=True)
    for folder in removed_raw:
        output.console.print(f"removed downloaded files {output.escape(str(folder))}", soft_wrap=True)
    if kept_raw:
        size = sum(tree_bytes(f) for f in kept_raw)
        where = ", ".join(str(f) for f in kept_raw)
        why = "still used by another dataset or a download" if raw else "kept for a re-conversion"
        output.note(
            f"the downloaded files ({output.human_bytes(size)}) are {why}: {where}"
            + ("" if raw else "; 'rlds rm --raw' removes them too, 'rlds gc --raw' removes every unused one")
        )


@handle_errors
def du(
    root: RootOption = None, json: JsonOption = False, quiet: QuietOption = False, verbose: VerboseOption = 0
) -> None:
    """Show how much disk the cache uses, by dataset (allocated blocks, as du counts them)."""
    from rlds_cli.cache.manage import disk_usage
    from rlds_cli.cache.root import CacheRoot

    usage = disk_usage(CacheRoot(root))
    if json:
        output.print_json(usage.to_dict())
        return
    if quiet:  # a report, not a list of names: -q leaves only errors
        return
    by_size = sorted(usage.datasets.items(), key=lambda kv: -kv[1])
    rows = [[name, output.human_bytes(size)] for name, size in by_size]
    parts = (("(raw downloads)", usage.raw), ("(temporary builds)", usage.tmp), ("(other)", usage.other))
    for label, size in parts:
        if size:
            rows.append([label, output.human_bytes(size)])
    rows.append(["total", output.human_bytes(usage.total)])
    output.print_table(
        [output.Column("what", kind="key"), output.Column("size", "right", kind="fixed")],
        rows,
        title=f"disk use of {usage.root}",
    )


@handle_errors
def gc(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only show what would be removed.")] = False,
    jobs: Annotated[
        bool, typer.Option("--jobs", help="Also remove interrupted preprocess jobs (no --resume after).")
    ] = False,
    raw: Annotated[
        bool, typer.Option("--raw", help="Also remove downloaded files no cached dataset was converted from.")
    ] = False,
    remote_cache: Annotated[
        Path | None,
        typer.Option(
            "--remote-cache",
            help='Also clean this remote-read cache folder (e.g. "$RLDS_REMOTE_CACHE"): leftovers of '
            "killed readers, and blocks that fail their checksum.",
            readable=False,  # an unreadable folder is gc's one-line error, not a usage error
        ),
    ] = None,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Remove leftovers of killed builds and unpublished directories, and the retired segments
    of growing datasets past their grace period, with their sizes; with --remote-cache, a remote
    cache's leftovers and damaged blocks too."""
    from rlds_cli.cache.layout import MANIFEST_FILE
    from rlds_cli.cache.manage import collect_garbage, interrupted_jobs, manifestless_datasets, tree_bytes
    from rlds_cli.cache.root import CacheRoot

    remote = None
    if remote_cache is not None:
        from rlds_cli.remote.block_gc import gc_blocks

        remote = gc_blocks(remote_cache, dry_run=dry_run)

    cache = CacheRoot(root)
    # sizes are measured before anything goes (a removed path has none)
    sizes = {p: tree_bytes(p) for p in collect_garbage(cache, dry_run=True, jobs=jobs, raw=raw)}
    removed = collect_garbage(cache, dry_run=dry_run, jobs=jobs, raw=raw) if sizes else []
    growing, skipped = _growing_garbage(cache, dry_run)
    headless = manifestless_datasets(cache)
    sizes |= growing
    removed += list(growing)
    removed_sizes = {p: sizes.get(p, 0) for p in removed}
    kept = [] if jobs else interrupted_jobs(cache)
    kept_size = sum(tree_bytes(job) for job in kept)
    if json:
        output.print_json(
            {
                "dry_run": dry_run,
                "removed": [str(p) for p in removed],
                "removed_bytes": {str(p): n for p, n in removed_sizes.items()},
                "total_bytes": sum(removed_sizes.values()),
                "kept_jobs": [str(p) for p in kept],
                "kept_jobs_bytes": kept_size,
                "skipped": [{"name": name, "error": why} for name, why in skipped],
                "damaged": [str(p) for p in headless],
                **({"remote_cache": remote.to_dict()} if remote is not None else {}),
            }
        )
        return
    for name, why in skipped:  # on stderr: --quiet's stdout is the removed paths alone
        output.warn(f"skipped growing dataset {name}: {why}")
    for folder in headless:
        output.warn(
            f"kept {folder}: it holds files but no {MANIFEST_FILE} (damage; views may read its arrays): "
            f"restore its {MANIFEST_FILE}, or remove the folder yourself"
        )
    remote_removed = [*remote.reclaimed, *remote.damaged, *remote.unledgered] if remote is not None else []
    if quiet:
        for path in [*removed, *remote_removed]:
            output.console.print(str(path), markup=False, soft_wrap=True)
        return
    verb = "would remove" if dry_run else "removed"
    if remote is not None:
        for path in remote.reclaimed:
            output.console.print(f"{verb} {output.escape(path)} (left by a killed reader)", soft_wrap=True)
        for path in remote.damaged:
            output.console.print(
                f"{verb} {output.escape(path)} (damaged: fails its checksum)", soft_wrap=True
            )
        for path in remote.unledgered:
            output.console.print(
                f"{verb} {output.escape(path)} (not in the cache's ledger: not counted)", soft_wrap=True
            )
        if remote_cache is not None and not remote_cache.exists():  # not made yet, or mistyped
            output.console.print(
                f"remote cache {output.escape(remote.folder)}: no such folder", soft_wrap=True
            )
        else:
            output.console.print(
                f"remote cache {output.escape(remote.folder)}: {remote.blocks} good block(s), "
                f"{output.human_bytes(remote.bytes)}", soft_wrap=True,
            )  # fmt: skip
    for path, size in removed_sizes.items():
        line = f"{verb} {output.escape(str(path))} ({output.human_bytes(size)})"
        output.console.print(line, soft_wrap=True)
    if removed:
        total = output.human_bytes(sum(removed_sizes.values()))
        output.console.print(f"{'would free' if dry_run else 'freed'} {total} in {len(removed)} path(s)")
    elif not remote_removed:
        output.console.print("nothing to remove")
    if kept:
        output.console.print(
            f"kept {len(kept)} failed or interrupted preprocess job(s), {output.human_bytes(kept_size)}, "
            "for --resume; 'rlds gc --jobs' removes them",
            soft_wrap=True,
        )


def _growing_garbage(cache: CacheRoot, dry_run: bool) -> tuple[dict[Path, int], list[tuple[str, str]]]:
    """Each growing dataset's retired segments past its grace period, removed (or not, with
    ``dry_run``), with their sizes; and the datasets that could not be read or cleaned, with
    why (they are left alone: ``rlds inspect NAME --check`` says more)."""
    from rlds_cli.cache.layout import SEGMENTED_LAYOUT
    from rlds_cli.cache.manage import tree_bytes
    from rlds_cli.errors import RldsError, from_os_error
    from rlds_cli.write.compact import remove_retired

    found: dict[Path, int] = {}
    skipped: list[tuple[str, str]] = []
    for manifest in cache.iter_manifests():
        if manifest.layout != SEGMENTED_LAYOUT:
            continue
        try:
            due = {p: tree_bytes(p) for p in remove_retired(manifest.name, cache, dry_run=True)}
            if due and not dry_run:
                due = {p: due.get(p, 0) for p in remove_retired(manifest.name, cache)}
        except RldsError as exc:
            skipped.append((manifest.name, str(exc)))
            continue
        except OSError as exc:  # a lock or a folder that cannot be read or written
            skipped.append((manifest.name, str(from_os_error(exc) or exc)))
            continue
        found |= due
    return found, skipped


@handle_errors
def path(
    name: NameArgument,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Print the directory of a dataset (for scripts: `cd $(rlds path NAME)`)."""
    from rlds_cli.cache.manage import dataset_path
    from rlds_cli.cache.root import CacheRoot
    from rlds_cli.catalog.registry import resolve_name

    cache = CacheRoot(root)
    resolved = resolve_name(name, cache)
    directory = dataset_path(cache, resolved)
    if json:
        output.print_json({"name": resolved, "path": str(directory)})
        return
    output.write_out(f"{directory}\n")


@handle_errors
def compact(
    name: Annotated[str, typer.Argument(help="A growing dataset (written with DatasetWriter).")],
    grace: Annotated[
        float | None,
        typer.Option(
            "--grace",
            help="Seconds to keep the merged segments' files for readers of older views "
            "(default: the dataset's grace_seconds; 0: remove them now).",
        ),
    ] = None,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Merge the segments of a growing dataset so it reads as fast as a converted one.

    Safe while writers append and readers sample: readers keep their view (the old segments'
    files stay for the grace period) and see the merged segment when they refresh.
    """
    from rlds_cli.cache.growing import grace_problem
    from rlds_cli.catalog.registry import resolve_name
    from rlds_cli.errors import SettingError
    from rlds_cli.write.compact import compact as run

    problem = grace_problem(grace, "--grace") if grace is not None else None
    if problem is not None:  # named as typed (the library names its keyword)
        raise SettingError(
            problem,
            hint="--grace 0 removes the merged segments' files now; leave it out for the dataset's own",
        )
    report = run(resolve_name(name, root), root, grace_seconds=grace)
    if json:
        output.print_json(report.to_dict())
        return
    if quiet:
        return
    output.console.print(
        f"{output.escape(report.name)}: {output.count(report.segments_before, 'segment')} -> "
        f"{report.segments_after:,} ({output.count(report.episodes, 'episode')}, "
        f"{output.count(report.steps, 'step')}); "
        f"{output.count(len(report.removed), 'retired segment')} removed",
        soft_wrap=True,
    )
    if report.runs_left:  # writers appended, or evicted the inputs of every plan, meanwhile
        output.console.print(
            f"{output.count(report.runs_left, 'run')} of segments still unmerged (writers changed "
            f"the dataset meanwhile): run `rlds compact {output.escape(report.name)}` again",
            soft_wrap=True,
        )
