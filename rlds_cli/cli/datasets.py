"""``rlds list`` and ``rlds inspect``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from rlds_cli.cli import _output
from rlds_cli.cli._errors import handle_errors
from rlds_cli.cli.options import JsonOption, RootOption, cached_name


@handle_errors
def list_datasets(
    root: RootOption = None,
    json: JsonOption = False,
    remote: Annotated[
        bool, typer.Option("--remote", help="List the registry (downloadable ids) instead of the cache.")
    ] = False,
) -> None:
    """List the datasets in the cache (or, with --remote, in the registry)."""
    if remote:
        from rlds_cli.cli.remote import list_remote

        return list_remote(root, json)
    from rlds_cli.cache.root import CacheRoot

    cache = CacheRoot(root)
    rows = []
    for m in cache.iter_manifests():
        directory = cache.dataset_dir(m.name)
        size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
        rows.append(
            {
                "name": m.name,
                "num_steps": m.num_steps,
                "num_episodes": m.num_episodes,
                "size_bytes": size,
                "backend": m.backend,
                "source": _source_label(m.source),
                "format": m.source.get("format", ""),
                "derived_from": [p.get("name") for p in m.lineage],
                "created_at": m.created_at,
            }
        )
    if json:
        _output.print_json({"root": str(cache.path), "datasets": rows})
        return
    if not rows:
        _output.console.print(
            f"no datasets in {_output.escape(str(cache.path))} (add one with 'rlds download')"
        )
        return
    table = Table(title=f"datasets in {_output.escape(str(cache.path))}", title_justify="left")
    for col, justify in (
        ("name", "left"),
        ("steps", "right"),
        ("episodes", "right"),
        ("size", "right"),
        ("backend", "left"),
        ("source", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        table.add_row(
            r["name"],
            f"{r['num_steps']:,}",
            f"{r['num_episodes']:,}",
            _output.human_bytes(r["size_bytes"]),
            r["backend"],
            _output.escape(f"{r['format']}: {r['source']}"),
        )
    _output.console.print(table)


@handle_errors
def inspect(
    name: Annotated[str, typer.Argument(help="Dataset name in the cache.")],
    root: RootOption = None,
    json: JsonOption = False,
    check: Annotated[
        bool,
        typer.Option("--check", help="Validate the TED invariants; exit 1 on any violation."),
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
) -> None:
    """Show a dataset's schema, counts, statistics, episode histograms and provenance."""
    from rlds_cli.cache.dataset import open_dataset
    from rlds_cli.summary import describe

    dataset = open_dataset(cached_name(name, root), root)
    info = describe(dataset, statistics=stats)
    if plot is not None:
        from rlds_cli.plot import plot_dataset

        info["plot"] = str(plot_dataset(dataset, plot))
    report = None
    if check:
        from rlds_cli.validate import check_dataset

        report = check_dataset(dataset)
        info["check"] = report.to_dict()
    if json:
        _output.print_json(info)
    else:
        render_summary(info)
        if report is not None:
            _render_check(report)
    if report is not None and not report.ok:
        raise typer.Exit(1)


def _source_label(source: dict[str, Any]) -> str:
    """Where a dataset came from, in a few words: registry id, file, or a view's parent range."""
    if source.get("format") == "view":
        a, b = source.get("episodes", ["?", "?"])
        return f"{source.get('parent', '?')} episodes {a}:{b}"
    return str(source.get("id") or source.get("path", ""))


def _render_check(report: Any) -> None:
    """Print the result of ``rlds inspect --check``: one line per violation."""
    out = _output.console
    if report.ok:
        out.print(f"[green]check passed[/]: {', '.join(report.checks)}")
        return
    for violation in report.violations[:50]:
        out.print(f"[red]violation[/] {_output.escape(str(violation))}", soft_wrap=True)
    more = len(report.violations) - 50
    if more > 0 or report.truncated:
        out.print(f"... and {'more than ' if report.truncated else ''}{max(more, 0)} more")
    out.print(f"[red]check failed[/]: {len(report.violations)}{'+' if report.truncated else ''} violation(s)")


def _fmt_stats(s: dict[str, float], digits: int = 2) -> str:
    return (
        f"min {s['min']:.{digits}f}  mean {s['mean']:.{digits}f}  max {s['max']:.{digits}f}  "
        f"std {s['std']:.{digits}f}"
    )


def render_summary(info: dict[str, Any]) -> None:
    """Print the tables of ``rlds inspect``."""
    out = _output.console
    out.print(
        f"[bold]{info['name']}[/]  ({info['backend']}, {_output.human_bytes(info['size_bytes'])})  "
        f"{_output.escape(info['path'])}"
    )
    out.print(
        f"steps {info['num_steps']:,}   episodes {info['num_episodes']:,}   "
        f"terminated {info['episodes_terminated']:,}   truncated {info['episodes_truncated']:,}"
    )
    out.print(f"episode length  {_fmt_stats(info['episode_length'], 1)}")
    out.print(f"episode return  {_fmt_stats(info['episode_return'])}")
    for label, key in (("episode lengths", "episode_length"), ("episode returns", "episode_return")):
        if info.get("histograms", {}).get(key, {}).get("counts"):
            _render_histogram(label, info["histograms"][key])
    table = Table(title="TED fields (per step)", title_justify="left")
    for col in ("key", "shape", "dtype", "storage", "disk"):
        table.add_column(col, justify="right" if col == "disk" else "left")
    for key, spec in info["fields"].items():
        stored = info["stored"].get(key)
        if stored:
            where = "flat: once + 1 per episode" if stored["storage"] == "flat" else "per step"
            disk = _output.human_bytes(stored["bytes"])
            ratio = stored.get("compression_ratio")
            if info["backend"] == "zarr" and ratio:
                disk += f" ({ratio:.1f}x)"
        elif key.startswith("next/") and info["stored"].get(key[5:], {}).get("storage") == "flat":
            where, disk = _output.escape(f"= {key[5:]}[t+1]"), "-"
        else:
            where, disk = "derived", "-"
        table.add_row(_output.escape(key), str(tuple(spec["shape"])), spec["dtype"], where, disk)
    out.print(table)
    with_stats = {k: v["stats"] for k, v in info["stored"].items() if v.get("stats")}
    if with_stats:
        stats_table = Table(title="statistics (all elements)", title_justify="left")
        for col in ("key", "min", "max", "mean", "std", "nan", "inf"):
            stats_table.add_column(col, justify="left" if col == "key" else "right")
        for key, stats in with_stats.items():
            stats_table.add_row(_output.escape(key), *_stat_cells(stats))
        out.print(stats_table)
    src = info["source"]
    out.print(
        f"source  {_output.escape(str(src.get('format', '?')))}: "
        f"{_output.escape(str(src.get('id') or src.get('path', '?')))}  "
        f"sha256 {str(src.get('sha256', '?'))[:16]}..."
    )
    conv = info["conversion"]
    facts = [
        f"{k.replace('_', ' ')} {conv[k]}"
        for k in ("dropped_rows", "dropped_episodes", "synthesized_final_observations", "inferred_boundaries")
        if conv.get(k)
    ]
    if facts:
        out.print("conversion  " + ", ".join(facts) + "  (rules: docs/formats.md)")
    for note in conv.get("notes", []):
        out.print(f"note  {_output.escape(note)}")
    for parent in info.get("lineage", []):
        _render_lineage(parent)
    out.print(f"written by {info['created_by']} at {info['created_at']}")


def _stat_cells(stats: dict[str, Any]) -> list[str]:
    """min, max, mean, std, NaN and inf cells of one stored key."""
    if "true" in stats:
        return ["", "", f"{stats['true'] / max(stats['count'], 1):.3g} true", "", "", ""]
    cells = [f"{stats[k]:.4g}" if stats.get(k) is not None else "-" for k in ("min", "max", "mean", "std")]
    nan, inf = stats.get("nan", 0), stats.get("posinf", 0) + stats.get("neginf", 0)
    return [*cells, f"[red]{nan}[/]" if nan else "0", f"[red]{inf}[/]" if inf else "0"]


def _render_histogram(label: str, hist: dict[str, list[float]], width: int = 30, lines: int = 10) -> None:
    """A horizontal bar chart of a histogram, at most ``lines`` bins (neighbours merged)."""
    out = _output.console
    counts, edges = list(hist["counts"]), list(hist["edges"])
    merge = max(1, -(-len(counts) // lines))
    counts = [sum(counts[i : i + merge]) for i in range(0, len(counts), merge)]
    edges = edges[::merge] if (len(edges) - 1) % merge == 0 else [*edges[::merge], edges[-1]]
    top = max(counts) or 1
    out.print(f"[bold]{label}[/]")
    for count, lo, hi in zip(counts, edges[:-1], edges[1:], strict=True):
        bar = "█" * round(width * count / top)
        out.print(f"  {lo:>10.4g} .. {hi:<10.4g} {bar} {count}")


def _render_lineage(parent: dict[str, Any]) -> None:
    """One line per parent of a derived dataset (``rlds preprocess``): what made it from what."""
    args = ", ".join(f"{k}={v}" for k, v in parent.get("args", {}).items() if v is not None)
    _output.console.print(
        f"derived from {_output.escape(str(parent.get('name', '?')))} "
        f"(manifest {str(parent.get('digest', '?'))[:12]}) by {_output.escape(str(parent.get('fn', '?')))} "
        f"(sha256 {str(parent.get('fn_sha256') or '?')[:12]}; {_output.escape(args)}; "
        f"rlds {parent.get('rlds_version', '?')})",
        soft_wrap=True,
    )
