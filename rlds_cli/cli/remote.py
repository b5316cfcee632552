"""``rlds list --remote`` and ``rlds info``: the registry, without downloading anything."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.text import Text

from rlds_cli.cli import output
from rlds_cli.cli.options import JsonOption, QuietOption, RootOption, VerboseOption
from rlds_cli.cli.output import handle_errors

#: What an unknown figure looks like in a table.
UNKNOWN = "-"


def _state(row: dict[str, Any]) -> str:
    if row["cached"]:
        return "converted"
    return "downloaded" if row["downloaded"] else "-"


def _approx_count(n: int) -> str:
    """``~1M``, ``~999K``: a published, rounded count (as rounded as its source)."""
    for div, unit in ((1_000_000_000, "B"), (1_000_000, "M"), (1_000, "K")):
        if n >= div:
            value = n / div
            return f"~{value:.0f}{unit}" if value >= 10 or value == int(value) else f"~{value:.1f}{unit}"
    return f"~{n}"


def _size_cell(row: dict[str, Any]) -> str:
    if row["size_bytes"] is not None:
        return output.human_bytes(row["size_bytes"])
    if row["approx_size_bytes"]:
        return "~" + output.human_bytes(row["approx_size_bytes"])
    return UNKNOWN


def _steps_cell(row: dict[str, Any]) -> str:
    if row["num_steps"]:
        return f"{row['num_steps']:,}"
    if row["approx_num_steps"]:
        return _approx_count(row["approx_num_steps"])
    return UNKNOWN


def list_remote(root: Any, pattern: str | None, *, json: bool, quiet: bool) -> None:
    """Print the registry entries (those matching ``pattern``) with size, steps, format, local
    state and description."""
    from rlds_cli.cache.root import CacheRoot
    from rlds_cli.inspection.listing import list_registry

    cache = CacheRoot(root)
    rows = [d.to_dict() for d in list_registry(pattern, cache)]
    if json:
        output.print_json({"root": str(cache.path), "pattern": pattern, "datasets": rows})
        return
    if quiet:
        for r in rows:
            output.console.print(Text(r["id"]), soft_wrap=True)
        return
    if not rows:
        output.console.print(
            Text(f"no registry id, alias or description matches {pattern!r}"), soft_wrap=True
        )
        return
    columns = [
        output.Column("id", kind="key"),
        output.Column("format", kind="fixed", optional=True),
        output.Column("size", "right", kind="fixed"),
        output.Column("steps", "right", kind="fixed"),
        output.Column("local", kind="fixed", optional=True),
        output.Column("hub", kind="fixed", optional=True),
        output.Column("description", optional=True),
    ]
    table = [
        [
            r["id"],
            r["format"],
            _size_cell(r),
            _steps_cell(r),
            _state(r),
            r["hub_repo"] or UNKNOWN,
            r["description"],
        ]
        for r in rows
    ]
    what = f"matching {pattern!r}" if pattern is not None else "in the registry"
    output.print_table(columns, table, title=f"{len(rows)} dataset(s) {what}")
    output.console.print(
        Text(
            f"size: download size; {UNKNOWN}: not published, known after the first download; "
            "~: rounded, as published upstream ('rlds info ID' says where)"
        )
    )
    _hub_note(rows)


def _hub_note(rows: list[dict[str, Any]]) -> None:
    """Which of the ids listed come from the Hugging Face Hub, by repo."""
    repos: dict[str, int] = {}
    for r in rows:
        if r["hub_repo"]:
            repos[r["hub_repo"]] = repos.get(r["hub_repo"], 0) + 1
    if not repos:
        return
    listed = ", ".join(f"{repo} ({n})" for repo, n in sorted(repos.items()))
    output.console.print(
        Text(
            f"hub: {sum(repos.values())} of {len(rows)} id(s) come from the Hugging Face Hub: {listed}; "
            "'rlds list --remote ORG/REPO' lists one repo's ids, 'rlds download hf://datasets/ORG/REPO/PATH' "
            "fetches any folder of a Hub dataset repo"
        ),
        soft_wrap=True,
    )


@handle_errors
def info(
    dataset_id: Annotated[str, typer.Argument(help="A registry id or alias.", metavar="ID")],
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Show a registry entry (files, URLs, hashes, local state) without downloading it.

    With -q only the entry's id is printed (an alias resolved to its id).
    """
    from rlds_cli.cache.root import CacheRoot
    from rlds_cli.catalog import registry
    from rlds_cli.inspection.listing import registry_status

    cache = CacheRoot(root)
    if not registry.is_known(dataset_id):
        _not_in_registry(dataset_id, cache)
    row = registry_status(dataset_id, cache).to_dict()
    if json:
        output.print_json(row)
        return
    if quiet:
        output.console.print(Text(row["id"]), soft_wrap=True)
        return
    out, esc = output.console, output.escape
    out.print(f"[bold]{esc(row['id'])}[/]  ({row['format']})  {esc(row['description'])}", soft_wrap=True)
    if row["aliases"]:
        out.print(f"aliases  {esc(', '.join(row['aliases']))}")
    out.print(f"license  {esc(row['license'] or UNKNOWN)}")
    out.print(f"cache name  {esc(row['cache_name'])}   local: {_state(row)}")
    steps = _steps_cell(row)
    if steps != UNKNOWN or row["num_episodes"]:
        episodes = f"{row['num_episodes']:,}" if row["num_episodes"] else UNKNOWN
        out.print(f"steps  {steps}   episodes  {episodes}   download size  {_size_cell(row)}")
    if row["published"]:
        out.print(f"published figures (rounded)  from {esc(row['published']['source'])}", soft_wrap=True)
    if row["options"]:
        out.print("reader hints  " + ", ".join(f"{k}={v}" for k, v in row["options"].items()))
    if row["hub_url"]:
        out.print(f"hugging face hub  {esc(row['hub_url'])}  (repo {esc(row['hub_repo'])})", soft_wrap=True)
    if row["listing"]:
        lst = row["listing"]
        out.print(
            f"files  listed from the Hugging Face folder {esc(lst['hf_repo'])}/{esc(lst['path'])} "
            "at download time",
            soft_wrap=True,
        )
    for f in row["files"]:
        sha = f["sha256"] or "unknown (recorded on first download)"
        origin = f" ({f['sha256_origin']})" if f["sha256"] else ""
        size = UNKNOWN if f["size"] is None else output.human_bytes(f["size"])
        out.print(f"  {esc(f['name'])}  size {size}  sha256 {sha}{origin}", soft_wrap=True)
        for url in f["urls"]:
            out.print(f"    {esc(url)}", soft_wrap=True)
    out.print(f"defined in {esc(row['registry_file'])}", soft_wrap=True)


def _not_in_registry(name: str, cache: Any) -> None:
    """Raise the right error for a name the registry does not know: a cached dataset (made
    locally, or renamed) is not a registry id, and the hint says what to run instead."""
    from rlds_cli.catalog import registry
    from rlds_cli.errors import InvalidNameError, UnknownDatasetIdError

    try:
        cached = cache.exists(name)
    except InvalidNameError:
        cached = False
    if not cached:
        registry.resolve(name)  # raises UnknownDatasetIdError with close ids in the hint
    source = cache.manifest(name).source
    origin = source.get("id")
    hint = f"'rlds inspect {name}' shows it"
    if origin and registry.is_known(str(origin)):
        hint += f"; it was converted from registry id {origin!r}: 'rlds info {origin}'"
    raise UnknownDatasetIdError(f"{name!r} is a dataset in the cache, not a registry id", hint=hint)
