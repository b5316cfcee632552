"""What datasets there are: in the cache (``rlds list``, ``rlds inspect``, ``rlds score``, ``rlds
stats``) and in the registry (``rlds list --remote``, ``rlds info``, nothing downloaded).

``rlds score`` gives episode returns as D4RL normalized scores (:func:`rlds_cli.normalized_score`);
``rlds stats`` the normalization statistics of datasets, one table per source, as a mixture's
``Normalize`` per source takes them (:class:`rlds_cli.NormalizationTable`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from rlds_cli.cli import output
from rlds_cli.cli.output import JsonOption, QuietOption, RootOption, VerboseOption, handle_errors

PatternArgument = Annotated[
    str | None,
    typer.Argument(
        help="Show only what contains PATTERN (or matches it as a glob: *, ?): names, or with "
        "--remote ids, aliases and descriptions (best matches first: the id, ids starting with "
        "it, ids where it starts a word, then the rest).",
        metavar="PATTERN",
        show_default=False,
    ),
]


@handle_errors
def list_datasets(
    pattern: PatternArgument = None,
    remote: Annotated[
        bool, typer.Option("--remote", help="List the registry (downloadable ids) instead of the cache.")
    ] = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """List the datasets in the cache (or, with --remote, in the registry)."""
    if remote:
        return list_remote(root, pattern, json=json, quiet=quiet)
    from rlds_cli.cache.root import CacheRoot
    from rlds_cli.inspection.listing import list_datasets as cached_datasets

    cache = CacheRoot(root)
    rows = [d.to_dict() for d in cached_datasets(pattern, cache)]
    if not quiet:  # a dataset whose manifest is damaged is not listed: say so, not nothing
        from rlds_cli.cache.manage import manifestless_datasets
        from rlds_cli.catalog.registry import matches

        for name, exc in cache.damaged_manifests():
            if pattern is None or matches(pattern, name):
                output.warn(f"not listed: {exc.message} ({exc.hint})")
        for folder in manifestless_datasets(cache):  # a deleted manifest: the folder said nothing
            if pattern is None or matches(pattern, folder.name):
                output.warn(
                    f"not listed: {folder} holds files but no manifest.json (damage; views may read its "
                    "arrays): restore its manifest.json, or remove the folder yourself"
                )
        for r in rows:
            if r["damaged"] is not None:
                why = str(r["damaged"]).removeprefix(f"growing dataset {r['name']!r} is damaged: ")
                output.warn(f"{r['name']} is damaged: {why} (rlds inspect {r['name']} --check)")
    if json:
        output.print_json({"root": str(cache.path), "datasets": rows})
        return
    if quiet:
        for r in rows:
            output.console.print(Text(r["name"]), soft_wrap=True)
        return
    if not rows:
        what = f"matching {pattern!r} " if pattern is not None else ""
        output.console.print(
            Text(f"no datasets {what}in {cache.path} (add one with 'rlds download')"), soft_wrap=True
        )
        return
    columns = [
        output.Column("name", kind="key"),
        output.Column("steps", "right", kind="fixed"),
        output.Column("episodes", "right", kind="fixed"),
        output.Column("size", "right", kind="fixed"),
        output.Column("storage", kind="fixed", optional=True),
        output.Column("source", optional=True),
    ]
    table = [
        [
            r["name"],
            "damaged" if r["damaged"] else f"{r['num_steps']:,}",
            "?" if r["damaged"] else f"{r['num_episodes']:,}",
            output.human_bytes(r["size_bytes"]),
            r["backend"],
            f"{r['format']}: {r['source']}",
        ]
        for r in rows
    ]
    output.print_table(columns, table, title=f"datasets in {cache.path}")


@handle_errors
def inspect(
    name: Annotated[
        str,
        typer.Argument(
            help="Dataset name in the cache (or a registry id or alias), or the URL of a pushed zarr dataset."
        ),
    ],
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="Validate the TED invariants and content digests; exit 1 on any violation."
        ),
    ] = False,
    stats: Annotated[
        bool, typer.Option("--stats/--no-stats", help="Scan every array for min/max/mean/std and NaN/inf.")
    ] = True,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot", help="Write a PNG of return/length histograms and episode traces (matplotlib)."
        ),
    ] = None,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Show a dataset's schema, counts, statistics, episode histograms and provenance.

    With -q nothing is printed: the exit status tells whether --check passed, and --plot still
    writes its file.
    """
    from rlds_cli.catalog.registry import resolve_name
    from rlds_cli.inspection.summary import describe
    from rlds_cli.loader.opening import open_dataset
    from rlds_cli.remote.reader import RemoteDataset, is_url

    # a URL: the pushed zarr dataset, read where it lies (credentials from the environment)
    dataset = open_dataset(name) if is_url(name) else open_dataset(resolve_name(name, root), root)
    # -q prints nothing: skip the scan unless --json asks for it
    info: dict[str, Any] = describe(dataset, statistics=stats) if json or not quiet else {}
    if info and isinstance(dataset, RemoteDataset):
        dataset.fix_summary(info)
    if plot is not None:
        from rlds_cli.inspection.summary import plot_dataset

        info["plot"] = str(plot_dataset(dataset, plot, root))
    report = None
    if check:
        from rlds_cli.inspection.validate import check_dataset

        report = check_dataset(dataset)
        info["check"] = report.to_dict()
    if json:
        output.print_json(info)
    elif not quiet:
        render_summary(info)
        if report is not None:
            _render_check(report)
        if plot is not None:
            output.console.print(Text(f"plot written to {info['plot']}"), soft_wrap=True)
    if report is not None and not report.ok:
        if not json:  # as verify: the failure on stderr too, whatever -q says
            count = f"{len(report.violations)}{'+' if report.truncated else ''}"
            shown = name if is_url(name) else info.get("name", name)  # a URL: not the cache's name
            mend = (
                "push it again from a good copy ('rlds push NAME URL --force')"
                if is_url(name)
                else f"'rlds verify {shown}' checks every file"
            )
            listed = f"'rlds inspect {shown} --check' without -q lists them" if quiet else "listed above"
            output.error(f"{shown}: check failed: {count} violation(s)", f"{listed}; {mend}")
        raise typer.Exit(1)


def _render_check(report: Any) -> None:
    """Print the result of ``rlds inspect --check``: one line per violation."""
    out = output.console
    for check, why in report.skipped.items():
        out.print(f"[yellow]skipped[/] {output.escape(check)}: {output.escape(why)}", soft_wrap=True)
    if report.ok:
        out.print(f"[green]check passed[/]: {', '.join(report.checks)}")
        return
    for violation in report.violations[:50]:
        out.print(f"[red]violation[/] {output.escape(str(violation))}", soft_wrap=True)
    more = len(report.violations) - 50
    if more > 0 or report.truncated:
        out.print(f"... and {'more than ' if report.truncated else ''}{max(more, 0)} more")
    out.print(f"[red]check failed[/]: {len(report.violations)}{'+' if report.truncated else ''} violation(s)")


def _fmt_stats(s: dict[str, Any], digits: int = 2) -> str:
    if s["mean"] is None:
        return "- (no episode)"

    def fixed(x: float) -> str:  # 1e308 as 309 digits filled the screen
        return f"{x:.{digits}f}" if abs(x) < 1e12 else f"{x:.{digits + 1}g}"

    return "  ".join(f"{name} {fixed(s[name])}" for name in ("min", "mean", "max", "std"))


def render_summary(info: dict[str, Any]) -> None:
    """Print the tables of ``rlds inspect``."""
    out = output.console
    # a local dataset's size is disk use (allocated blocks, as 'rlds list' shows it); a dataset
    # read at a URL has no blocks: its size is the bytes of its files on the store
    where = "on the store" if "://" in info["path"] else "on disk"
    out.print(
        f"[bold]{info['name']}[/]  ({info['backend']}, {output.human_bytes(info['size_bytes'])} {where})  "
        f"{output.escape(info['path'])}",
        soft_wrap=True,  # the path whole on the line, never broken at the console's width
    )
    out.print(
        f"steps {info['num_steps']:,}   episodes {info['num_episodes']:,}   "
        f"terminated {info['episodes_terminated']:,}   truncated {info['episodes_truncated']:,}"
    )
    lengths = info["episode_length"]  # steps: whole numbers, their mean and std not
    if lengths["mean"] is None:
        out.print("episode length  - (no episode)")
    else:
        out.print(
            f"episode length  min {int(lengths['min']):,}  mean {lengths['mean']:,.1f}  "
            f"max {int(lengths['max']):,}  std {lengths['std']:,.1f}"
        )
    out.print(f"episode return  {_fmt_stats(info['episode_return'])}")
    for label, key in (("episode lengths", "episode_length"), ("episode returns", "episode_return")):
        if info.get("histograms", {}).get(key, {}).get("counts"):
            _render_histogram(label, info["histograms"][key], integers=key == "episode_length")
    rows = []
    for key, spec in info["fields"].items():
        stored = info["stored"].get(key)
        if stored:
            where = "flat: once + 1 per episode" if stored["storage"] == "flat" else "per step"
            disk = output.human_bytes(stored["bytes"])
            ratio = stored.get("compression_ratio")
            if (info["backend"] == "zarr" or stored.get("codec", "raw") != "raw") and ratio:
                disk += f" ({ratio:.1f}x)"
        elif key.startswith("next/") and info["stored"].get(key[5:], {}).get("storage") == "flat":
            where, disk = f"= {key[5:]}[t+1]", "-"
        else:
            where, disk = "derived", "-"
        codec = spec.get("codec", "raw")
        dtype = spec["dtype"] if codec == "raw" else f"{spec['dtype']} {codec}"
        rows.append([key, str(tuple(spec["shape"])), dtype, where, disk])
    output.print_table(
        [
            output.Column("key", kind="key"),
            output.Column("shape", kind="fixed"),
            output.Column("dtype", kind="fixed"),
            output.Column("storage"),
            output.Column("bytes", "right", kind="fixed"),  # the key's files (not blocks)
        ],
        rows,
        title="TED fields (per step)",
    )
    with_stats = {k: v["stats"] for k, v in info["stored"].items() if v.get("stats")}
    if with_stats:
        output.print_table(
            [
                output.Column("key", kind="key"),
                *(output.Column(c, "right", kind="fixed") for c in ("min", "max", "mean", "std")),
                *(output.Column(c, "right", kind="fixed") for c in ("nan", "inf")),
            ],
            [[key, *_stat_cells(stats)] for key, stats in with_stats.items()],
            title="statistics (all elements)",
        )
    source_line = _source_line(info["source"])
    if source_line:
        out.print(source_line, soft_wrap=True)
    for line in _evaluation_lines(info):
        out.print(line, soft_wrap=True)
    conv = info["conversion"]
    facts = [
        f"{k.replace('_', ' ')} {conv[k]}"
        for k in ("dropped_rows", "dropped_episodes", "synthesized_final_observations", "inferred_boundaries")
        if conv.get(k)
    ]
    if facts:
        rules = f"  (format rules {conv['rules']})" if conv.get("rules") else ""
        out.print("conversion  " + ", ".join(facts) + rules)
    for note in conv.get("notes", []):
        out.print(f"note  {output.escape(note)}")
    card = info.get("card") or {}
    if card.get("license") or card.get("citation"):
        licenses = card.get("license") or "not declared"
        shown = ", ".join(licenses) if isinstance(licenses, list) else str(licenses)
        origin = f" (from {card['license_from']})" if card.get("license_from") else ""
        cite = "; citation given ('rlds inspect --json' shows it)" if card.get("citation") else ""
        out.print(f"license  {output.escape(shown)}{origin}{cite}", soft_wrap=True)
        for conflict in card.get("license_conflicts", []):
            out.print(f"  {output.escape(conflict)}", soft_wrap=True)
    for parent in info.get("lineage", []):
        _render_lineage(parent)
    if "growing" in info:
        _render_growing(info["growing"])
    out.print(_digest_line(info.get("content_digest") or {}, info["source"]), soft_wrap=True)
    by = f" by {output.escape(info['created_by'])}" if info.get("created_by") else ""
    out.print(f"written{by} at {info['created_at']}" if info.get("created_at") else f"written{by}")


def _evaluation_lines(info: dict[str, Any]) -> list[str]:
    """The environment (with where it came from) and the reference scores, when known."""
    lines = []
    env = info.get("env")
    if env:
        steps = f", at most {env['max_episode_steps']} steps" if env.get("max_episode_steps") else ""
        kwargs = f", kwargs {env['kwargs']}" if env.get("kwargs") else ""
        lines.append(f"environment  {env['id']}{steps}{kwargs}  (from {env['origin']})")
    scores = info.get("reference_scores")
    if scores:
        lines.append(
            f"reference scores  min {scores['ref_min_score']:.6g}, max {scores['ref_max_score']:.6g}  "
            f"(from {scores['origin']}; 'rlds score NAME RETURN' normalizes a return)"
        )
    return [output.escape(line) for line in lines]


def _render_growing(g: dict[str, Any]) -> None:
    """A growing dataset's segments, writers, eviction and readiness (``rlds inspect``)."""
    out = output.console
    pairs = (("min_size", "unprotected steps"), ("min_total", "steps"))
    needs = ", ".join(f"{g[k]:,} {what}" for k, what in pairs if g[k]) or "a step"
    ready = "[green]ready[/]" if g["ready"] else f"[yellow]not ready[/] (needs {needs})"
    caps = [
        f"{g[k]:,} {unit}"
        for k, unit in (("capacity", "steps"), ("capacity_episodes", "episodes"))
        if g.get(k)
    ]
    out.print(
        f"growing  {output.count(g['segments'], 'segment')} ({g['segments_on_disk']:,} on disk), "
        f"{output.count(g['log_records'], 'log record')}, "
        f"{ready}; capacity {', '.join(caps) or 'none'}; {g['evicted_episodes']:,} episodes evicted, "
        f"{g['protected_episodes']:,} protected",
        soft_wrap=True,
    )
    for label, row in g["writers"].items():
        out.print(
            f"  writer {output.escape(label)}: {output.count(row['segments'], 'segment')}, "
            f"{output.count(row['episodes'], 'episode')}, {output.count(row['steps'], 'step')}",
            soft_wrap=True,
        )


def _stat_cells(stats: dict[str, Any]) -> list[str | Text]:
    """min, max, mean, std, NaN and inf cells of one stored key (non-zero counts in red)."""
    if "true" in stats:
        return ["", "", f"{stats['true'] / max(stats['count'], 1):.3g} true", "", "", ""]
    cells: list[str | Text] = [
        f"{stats[k]:.4g}" if stats.get(k) is not None else "-" for k in ("min", "max", "mean", "std")
    ]
    nan, inf = stats.get("nan", 0), stats.get("posinf", 0) + stats.get("neginf", 0)
    return [*cells, Text(str(nan), style="red" if nan else ""), Text(str(inf), style="red" if inf else "")]


def _render_histogram(
    label: str, hist: dict[str, list[float]], width: int = 30, lines: int = 10, *, integers: bool = False
) -> None:
    """A horizontal bar chart of a histogram, at most ``lines`` bins (neighbours merged). With
    ``integers`` (edges halfway between whole numbers, as
    :func:`rlds_cli.inspection.summary.length_histogram` makes them) each bin shows the whole numbers it
    holds."""
    out = output.console
    counts, edges = list(hist["counts"]), list(hist["edges"])
    merge = max(1, -(-len(counts) // lines))
    counts = [sum(counts[i : i + merge]) for i in range(0, len(counts), merge)]
    edges = edges[::merge] if (len(edges) - 1) % merge == 0 else [*edges[::merge], edges[-1]]
    top = max(counts) or 1
    block = output.glyph("block")
    out.print(f"[bold]{label}[/]")
    for count, lo, hi in zip(counts, edges[:-1], edges[1:], strict=True):
        bar = block * round(width * count / top)
        if not integers:
            span = f"{lo:>10.4g} .. {hi:<10.4g}"
        elif math.ceil(lo) == math.floor(hi):  # a bin of one length
            span = f"{math.ceil(lo):>10,}    {'':<10}"
        else:
            span = f"{math.ceil(lo):>10,} .. {math.floor(hi):<10,}"
        out.print(f"  {span} {bar} {count}")


def _source_line(src: dict[str, Any]) -> str:
    """Where a converted dataset's data came from: format, registry id or path, download URL and
    the source's sha256. Empty for views and preprocessed outputs, whose lineage says it."""
    if src.get("format") in ("view", "rlds-preprocess", "composed", "rlds-downsample") or not src:
        return ""
    esc = output.escape
    parts = [f"source  {esc(str(src.get('format', 'unknown format')))}:"]
    if src.get("id"):
        parts.append(esc(str(src["id"])))
        if src.get("url"):
            parts.append(f"from {esc(str(src['url']))}")
    elif src.get("path"):
        parts.append(esc(str(src["path"])) + (" (archive)" if src.get("archive") else ""))
    elif isinstance(src.get("writer"), dict):  # DatasetWriter / record(): who wrote it first
        who = src["writer"]
        host, pid, by = who.get("host", "?"), who.get("pid", "?"), who.get("created_by", "?")
        parts.append(esc(f"written on {host} (pid {pid}) by {by}"))
    files = src.get("files") or []
    if len(files) > 1:
        parts.append(f"({len(files)} files)")
    if src.get("sha256"):
        parts.append(f" sha256 {str(src['sha256'])[:16]}...")
    return " ".join(parts)


def _digest_line(content: dict[str, Any], source: dict[str, Any]) -> str:
    """What the recorded content digests cover (``rlds verify`` and ``--check`` compare them)."""
    columns = content.get("columns") or {}
    algorithm = content.get("algorithm", "sha256")
    if columns:
        return f"content digest  {algorithm} of {len(columns)} arrays and the episode index"
    if source.get("format") == "rlds-writer":  # each segment's manifest names its own algorithm
        return "content digest  of every array and episode index, per segment"
    if source.get("format") == "view" and content.get("episodes"):
        parent = output.escape(str(source.get("parent", "")))
        return f"content digest  {algorithm} of the episode index (the arrays: {parent}'s)"
    if source.get("format") == "composed" and content.get("episodes"):
        return f"content digest  {algorithm} of the episode index (the arrays: its parents')"
    return "content digest  none recorded (written by an older rlds)"


def _render_lineage(parent: dict[str, Any], depth: int = 0) -> None:
    """One line per parent of a derived dataset: which version of which dataset, and what made
    it from that (a view's episode range; ``rlds preprocess``'s function, its sha256 and
    arguments), then the parent's own lineage, indented. Facts not recorded are left out."""
    esc = output.escape
    version = [f"manifest {str(parent['digest'])[:12]}"] if parent.get("digest") else []
    if parent.get("created_at"):
        version.append(f"written at {parent['created_at']}")
    name = esc(str(parent.get("name", "")))
    line = f"{name} ({', '.join(version)})" if version else name
    rlds = f"rlds {parent['rlds_version']}" if parent.get("rlds_version") else ""
    if parent.get("op") == "view":
        episodes: list[Any] | tuple[Any, ...] = parent.get("episodes") or ()
        selection = f" episodes {episodes[0]}:{episodes[1]}" if len(episodes) == 2 else ""
        text = f"view of {line}{selection}" + (f"; {rlds}" if rlds else "")
    elif parent.get("fn"):
        args = ", ".join(f"{k}={v}" for k, v in parent.get("args", {}).items() if v is not None)
        details = [f"sha256 {str(parent['fn_sha256'])[:12]}"] if parent.get("fn_sha256") else []
        details += [esc(args)] if args else []
        details += [rlds] if rlds else []
        text = f"derived from {line} by {esc(str(parent['fn']))}"
        text += f" ({'; '.join(details)})" if details else ""
    elif parent.get("op") in ("merge", "trim", "select", "downsample"):  # rlds merge, trim, drop, downsample
        every = f"every {parent['every']} steps; " if parent.get("every") else ""
        text = f"derived from {line} by {parent['op']}" + (f" ({every}{rlds})" if rlds else "")
    else:
        text = f"derived from {line}" + (f" ({rlds})" if rlds else "")
    # a grandparent line continues the one above: 'which is a view of ...', 'which was derived ...'
    prefix = ("  " * depth + ("which is a " if text.startswith("view") else "which was ")) if depth else ""
    output.console.print(prefix + text, soft_wrap=True)
    for grandparent in parent.get("parent_lineage") or []:
        _render_lineage(grandparent, depth + 1)


@handle_errors
def score(
    name: Annotated[str, typer.Argument(help="A registry id (hopper-medium-v2), a cache name or an alias.")],
    returns: Annotated[
        list[float], typer.Argument(help="Undiscounted episode returns to normalize.", show_default=False)
    ],
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Normalize episode returns: 100 * (return - ref_min) / (ref_max - ref_min).

    The reference scores are D4RL's (from the registry: no download needed) or a Minari
    dataset's own (ref_min_score, ref_max_score: download it first). With -q only the scores
    are printed, one per line. Negative returns go after --.

    Example: rlds score hopper-medium-v2 1000 2500.5; rlds score pendulum -- -300
    """
    from rlds_cli.catalog.scores import reference_scores

    ref = reference_scores(name, root)
    bad = next((r for r in returns if not math.isfinite(r)), None)
    if bad is not None:
        raise typer.BadParameter(f"{bad} is not a finite return", param_hint="RETURNS")
    scores = [float(ref.normalize(r)) for r in returns]
    if json:
        output.print_json({"name": name, "reference_scores": ref.to_dict(), "returns": returns,
                            "normalized_scores": scores})  # fmt: skip
        return
    if quiet:
        output.write_out("".join(f"{s:.6g}\n" for s in scores))
        return
    out = output.console
    out.print(output.escape(
        f"{name}: reference scores min {ref.min:.6g}, max {ref.max:.6g} (from {ref.origin})"
    ), soft_wrap=True)  # fmt: skip
    for r, s in zip(returns, scores, strict=True):
        out.print(f"return {r:.6g}  ->  normalized score {s:.2f}")


def _fmt(values: Any, i: int) -> str:
    """Element ``i`` of a statistic (nested lists of any depth, ``None`` for "not finite")."""
    import numpy as np

    if values is None:
        return "-"
    flat = np.asarray(values, np.float64).ravel()
    return "-" if np.isnan(flat[i]) else f"{flat[i]:.4g}"


@handle_errors
def stats(
    names: Annotated[
        list[str],
        typer.Argument(help="Datasets (cache names or aliases), one source each.", show_default=False),
    ],
    key: Annotated[
        list[str] | None,
        typer.Option(
            "--key", "-k", help="Key to summarize (repeatable; default: action).", show_default=False
        ),
    ] = None,
    normalization_table: Annotated[
        Path | None,
        typer.Option(
            "--normalization-table",
            metavar="OUT.json",
            help="Write the table (per source, per key mean/std/min/max/q01/q99) to this JSON file, "
            "read back by NormalizationTable.load to un-normalize actions at inference.",
            show_default=False,
        ),
    ] = None,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Per-source normalization statistics (mean, std, min, max, q01, q99 per dimension).

    Each dataset's own statistics (a view's parent's), as MixtureLoader(...,
    transforms={name: Normalize(keys=KEYS)}) uses them; --normalization-table writes them as
    one JSON table for un-normalizing a mixture policy's actions per robot.

    Example: rlds stats robot-a robot-b --key action --normalization-table norm.json
    """
    import numpy as np

    from rlds_cli.cache.compose import verify_parent
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.cache.reader import stored_keys
    from rlds_cli.catalog.registry import resolve_name
    from rlds_cli.errors import MixtureError
    from rlds_cli.loader.normalization_table import NormalizationTable

    if normalization_table is not None and not normalization_table.parent.is_dir():
        raise MixtureError(
            f"cannot write {normalization_table}: its folder {normalization_table.parent} does not exist",
            hint="create the folder first, or write the table elsewhere",
        )
    resolved = [resolve_name(n, root) for n in names]
    keys = key or ["action"]
    for name in resolved:  # the statistics of a damaged column would un-normalize wrong at inference
        ds = open_dataset(name, root)
        verify_parent(ds, keys=stored_keys(ds.stored_fields, keys))
    table = NormalizationTable.from_datasets(resolved, keys, root=root)
    if normalization_table is not None:
        table.save(normalization_table, root=root)
    data = table.to_dict()
    for name, entry in data["sources"].items():
        for k, s in entry["keys"].items():
            unknown = [i for i, m in enumerate(np.asarray(s["mean"], object).reshape(-1)) if m is None]
            if unknown:
                shown = ", ".join(map(str, unknown[:8])) + (", ..." if len(unknown) > 8 else "")
                output.warn(
                    f"{name} {k}: {len(unknown)} of its {int(np.prod(s['shape']))} dimension(s) hold NaN or "
                    f"infinite values ({shown}): "
                    f"their statistics are unknown ('-', null in JSON), and Normalize would make every value "
                    f"of them NaN; 'rlds audit {name}' flags the episodes (nonfinite)"
                )
    if json:
        output.print_json(data)
        return
    if quiet:
        if normalization_table is not None:
            output.console.print(output.escape(str(normalization_table)), soft_wrap=True)
        return
    columns = [output.Column("source", kind="key"), output.Column("key", kind="key"),
               output.Column("dim", "right", "fixed")]  # fmt: skip
    columns += [output.Column(s, "right", "fixed") for s in ("mean", "std", "min", "max", "q01", "q99")]
    rows: list[list[Any]] = []
    for name, entry in data["sources"].items():
        for k, s in entry["keys"].items():
            for i, at in enumerate(np.ndindex(*s["shape"])):  # a key of several axes: every element
                dim = ",".join(map(str, at))
                rows.append(
                    [name, k, dim, *(_fmt(s[n], i) for n in ("mean", "std", "min", "max", "q01", "q99"))]
                )
    output.print_table(columns, rows)
    if normalization_table is not None:
        output.note(f"wrote {normalization_table} ({output.count(len(data['sources']), 'source')})")


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
