"""``rlds download``, ``rlds verify`` and ``rlds demo``: datasets fetched from their sources (or the
bundled demo file, no network), and checked against them again; the download's progress bars (one
bar per file: bytes, speed, ETA; then the conversion bar), drawn on stderr when it is a terminal,
silent otherwise.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Annotated, Any

import typer
from rich.progress import DownloadColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.text import Text

from rlds_cli.cli import output
from rlds_cli.cli.output import (
    FramesOption,
    JsonOption,
    NameOption,
    QuietOption,
    RootOption,
    StorageOption,
    VerboseOption,
    force_option,
    handle_errors,
)


@contextmanager
def download_progress(
    enabled: bool,
) -> Iterator[tuple[Callable[[str, str, int], None], Callable[[str, int], None]]]:
    """Yield ``(download_callback, conversion_callback)``.

    The download bars close when conversion starts (Rich draws one live display at a time).
    """
    bars, show = output.progress_bar(enabled, DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    tasks: dict[str, Any] = {}
    lock = threading.Lock()

    def on_download(event: str, name: str, value: int) -> None:
        with lock:
            if name not in tasks:
                tasks[name] = bars.add_task(output.escape(name), total=None)
            task = tasks[name]
            if event == "start":
                bars.update(task, total=value or None)
            elif event == "resume":
                bars.update(task, completed=value)
            elif event == "advance":
                bars.advance(task, value)
            elif event == "reset":
                bars.reset(task)
            elif event == "wait" and show:
                # print, not log: Rich's log() adds this file's name and line number
                bars.print(f"{output.escape(name)}: another rlds process is downloading it; waiting")
            # "retry": the library logs each retry once, with its reason (no second line here)
            elif event == "verify":
                bars.update(task, description=f"{output.escape(name)} (verifying)")
            elif event in ("done", "cached"):
                bars.update(task, total=value, completed=value, description=output.escape(name))

    with ExitStack() as stack:
        stack.enter_context(bars)
        converting: list[Callable[[str, int], None]] = []

        def on_convert(event: str, amount: int) -> None:
            if not converting:
                stack.close()  # stop the download bars before the conversion bar starts
                cm = output.conversion_progress(enabled)
                converting.append(cm.__enter__())
                outer.callback(cm.__exit__, None, None, None)
            converting[0](event, amount)

        with ExitStack() as outer:
            yield on_download, on_convert


def _parse_options(values: list[str] | None) -> list[str] | None:
    """Check that each ``--option`` is ``key=value`` (the key and value are checked against
    the format's options once the format is known)."""
    for value in values or []:
        key, eq, _ = value.partition("=")
        if not eq or not key.strip():
            raise typer.BadParameter(f"{value!r} is not key=value (e.g. --option last_step=drop)")
    return values


def _check_sha256(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise typer.BadParameter(f"{value!r} is not 64 hex digits")
    return value.lower() if value else value


@handle_errors
def download(
    source: Annotated[
        str,
        typer.Argument(
            help="A registry id or alias, an http(s) URL of one file, a Hub dataset repo "
            "hf://datasets/ORG/REPO[/PATH][@REVISION], or a local path."
        ),
    ],
    name: NameOption = None,
    format: Annotated[
        str | None, typer.Option("--format", help="Source format (default: registry's, or detect).")
    ] = None,
    storage: StorageOption = None,
    frames: FramesOption = None,
    force: Annotated[
        bool, force_option("Download again, re-convert and replace an existing dataset.")
    ] = False,
    offline: Annotated[
        bool,
        typer.Option(
            "--offline", help="Never touch the network: use downloaded files only (also RLDS_OFFLINE=1)."
        ),
    ] = False,
    keep_raw: Annotated[
        bool,
        typer.Option("--keep-raw/--no-keep-raw", help="Keep the downloaded files after conversion."),
    ] = True,
    sha256: Annotated[
        str | None,
        typer.Option(
            "--sha256",
            help="Expected sha256 of a URL or file (64 hex digits).",
            show_default=False,
            callback=_check_sha256,
        ),
    ] = None,
    license: Annotated[
        str | None,
        typer.Option(
            "--license",
            metavar="SPDX",
            help="The data's licence, an SPDX id (e.g. CC-BY-4.0), kept in the dataset's card "
            "(default: what the source or the registry declares).",
            show_default=False,
        ),
    ] = None,
    citation: Annotated[
        str | None,
        typer.Option(
            "--citation",
            metavar="TEXT",
            help="How to cite the data (e.g. BibTeX), kept in the card.",
            show_default=False,
        ),
    ] = None,
    max_episode_steps: Annotated[
        int | None,
        typer.Option("--max-episode-steps", min=1, help="Time limit, for D4RL files without 'timeouts'."),
    ] = None,
    allow_pickle: Annotated[
        bool, typer.Option("--allow-pickle", help="Let readers load pickled objects (trusted files only).")
    ] = False,
    workers: Annotated[
        int | None, typer.Option("--workers", min=1, help="Reader worker threads or processes.")
    ] = None,
    episodes: Annotated[
        str | None,
        typer.Option("--episodes", help="Convert only the source's episodes A:B (B empty: to the end)."),
    ] = None,
    keys: Annotated[
        str | None,
        typer.Option(
            "--keys", help="Comma-separated keys to keep besides action, reward and the done flags."
        ),
    ] = None,
    option: Annotated[
        list[str] | None,
        typer.Option(
            "--option",
            metavar="KEY=VALUE",
            help="A reader option of the format, key=value (repeatable; e.g. last_step=drop; an unknown "
            "key lists the format's options). Overrides the registry's.",
            show_default=False,
            callback=_parse_options,
        ),
    ] = None,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Download (resumable, verified) and convert a dataset into the TED cache.

    The default name is the registry entry's cache name, or for a file or URL its name without
    its suffixes (x.tar.gz -> x). With -q only that name is printed.
    """
    from rlds_cli.sources.download import download as run_download

    if name is not None:  # an empty --name is a mistake, never "use the default name"
        from rlds_cli.cache.root import validate_name

        validate_name(name)
    if frames is not None:  # a bad mode fails before any download
        from rlds_cli.frames.codecs import FramesMode

        FramesMode.parse(frames)
    if license is not None:  # an unknown licence fails before any download
        from rlds_cli.cache.card import spdx_id

        spdx_id(license)
    options: dict[str, object] = {"max_episode_steps": max_episode_steps, "workers": workers}
    if episodes is not None:
        options["episodes"] = episodes
    if keys is not None:
        options["keys"] = [k.strip() for k in keys.split(",") if k.strip()]
    if allow_pickle:
        options["allow_pickle"] = True
    for pair in option or []:  # strings: the reader's Options turn them into its types
        key, _, value = pair.partition("=")
        options[key.strip()] = value
    with download_progress(enabled=not (quiet or json)) as (on_download, on_convert):
        result = run_download(
            source,
            name=name,
            format=format,
            root=root,
            backend=storage,
            frames=frames,
            force=force,
            options=options,
            progress=on_convert,
            offline=True if offline else None,
            keep_raw=keep_raw,
            sha256=sha256,
            download_progress=on_download,
            license=license,
            citation=citation,
        )
    m = result.manifest
    if force and not result.reused:
        output.warn_stale_children(root, m.name)
    if json:
        output.print_json(
            {
                "name": m.name,
                "path": str(result.path),
                "reused": result.reused,
                "num_steps": m.num_steps,
                "num_episodes": m.num_episodes,
                "backend": m.backend,
                "frames": {k: s.codec for k, s in m.fields.items() if s.codec != "raw"},
                "downloads": m.source.get("downloads", []),
                "conversion": m.conversion,
            }
        )
        return
    if quiet:
        output.console.print(Text(m.name), soft_wrap=True)
        return
    for note in m.conversion.get("notes", []):
        output.warn(note)
    if m.conversion.get("inferred_boundaries"):
        output.warn(
            f"{m.conversion['inferred_boundaries']} episode boundaries were not flagged in the "
            "source and were inferred (see 'rlds inspect')"
        )
    report = m.conversion.get("frames")
    for key, how in (report.get("columns", {}) if isinstance(report, dict) else {}).items():
        made = "kept as they arrived" if how["encoded"] == 0 else f"encoded ({how['kept']:,} kept)"
        output.console.print(f"frames {output.escape(key)}: {how['codec']}, {made}", soft_wrap=True)
    verb = "already in the cache" if result.reused else "converted"
    output.console.print(
        f"[green]{output.escape(m.name)}[/]: {verb}: {output.count(m.num_steps, 'step')}, "
        f"{output.count(m.num_episodes, 'episode')}, "
        f"storage {m.backend} -> {output.escape(str(result.path))}",
        soft_wrap=True,
    )


@handle_errors
def verify(
    name: Annotated[str, typer.Argument(help="A dataset name in the cache, or a registry id.")],
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Check a dataset's source, parent, files and content digests; say what was checked.

    By kind: a download's files against their sha256; a local conversion's source file, when it
    is still there; a view's or preprocessed output's parent (still there, the same version).
    For every dataset: every stored file is complete and every array has the content digest
    recorded when it was written. Exits 1 when a check fails (with -q: only the exit status,
    and the error line); --json lists every check with pass, fail or skipped and why.
    """
    from rlds_cli.sources.verify import verify as run_verify

    report = run_verify(name, root)
    checks = report["checks"]
    if json:
        output.print_json(report)
    elif not quiet:
        esc = output.escape
        for c in checks:
            colour = {"pass": "green", "fail": "red"}.get(c["status"], "yellow")
            output.console.print(
                f"[{colour}]{c['status']:<7}[/] {esc(c['check'])}: {esc(c['detail'])}", soft_wrap=True
            )
    failed = [c for c in checks if c["status"] == "fail"]
    if failed:
        if not json:
            what = ", ".join(c["check"] for c in failed[:3]) + (" ..." if len(failed) > 3 else "")
            output.error(
                f"{report['name']}: verification failed: {len(failed)} of {len(checks)} checks ({what})",
                failed[0].get("hint", ""),
            )
        raise typer.Exit(1)
    if json or quiet:
        return
    passed = sum(c["status"] == "pass" for c in checks)
    skipped = len(checks) - passed
    label = f"{output.escape(report['name'])} ({report['kind']})"
    if not passed:  # never a bare "verified" after checking nothing
        output.console.print(f"[yellow]{label}: nothing could be checked ({skipped} skipped)[/]")
        return
    more = f", {skipped} skipped" if skipped else ""
    output.console.print(f"[green]{label}: verified[/] ({passed} checks passed{more})")


DEMO_ID = "pointmass-demo-v0"


@handle_errors
def demo(
    storage: StorageOption = None,
    batches: Annotated[int, typer.Option("--batches", min=1, help="Batches to sample.")] = 3,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Transitions per batch.")] = 256,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Convert the bundled demo dataset, inspect it, and sample batches through the loader.

    With -q only the dataset's name is printed; --json prints what each step found.
    """
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.cli.datasets import render_summary
    from rlds_cli.inspection.summary import describe
    from rlds_cli.sources.download import download

    show = not (json or quiet)
    out = output.console
    if show:
        out.rule("1. download + convert (bundled registry entry, no network)")
    with output.conversion_progress(enabled=show) as progress:
        result = download(DEMO_ID, root=root, backend=storage, progress=progress)
    if show:
        verb = "reused the cached copy of" if result.reused else "converted"
        out.print(f"{verb} [green]{DEMO_ID}[/] into {output.escape(str(result.path))}", soft_wrap=True)
        out.rule("2. inspect")
    dataset = open_dataset(DEMO_ID, root)
    if show:
        render_summary(describe(dataset))
        out.rule("3. sample through the loader (torch)")
    from rlds_cli.loader import Loader

    try:
        loader = Loader(dataset, batch_size=batch_size, seed=0, num_batches=batches)
    except ValueError as exc:  # a batch too large for this machine's memory: the option's value
        raise typer.BadParameter(str(exc), param_hint="--batch-size") from None
    sampled: list[dict[str, Any]] = []
    for i, batch in enumerate(loader):
        shapes = {
            k: list(v.shape)
            for k, v in batch.items()
            if k in ("observation", "action", "next/observation", "next/reward")
        }
        done = batch["next", "done"]
        facts = {
            "shapes": shapes,
            "mean_reward": float(batch["next", "reward"].mean().item()),
            "episode_ends": int(done.sum()),
            "episodes": len(set(batch["episode"].tolist())),
        }
        sampled.append(facts)
        if show:
            text = ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items())
            out.print(
                f"batch {i}: {text}; mean reward {facts['mean_reward']:+.3f}, "
                f"{facts['episode_ends']} episode ends, from {facts['episodes']} episodes",
                soft_wrap=True,  # one line a batch, whatever the console's width
            )
    if json:
        output.print_json(
            {
                "name": DEMO_ID,
                "path": str(result.path),
                "reused": result.reused,
                "num_steps": dataset.num_steps,
                "num_episodes": dataset.num_episodes,
                "batches": sampled,
            }
        )
    elif quiet:
        out.print(Text(DEMO_ID), soft_wrap=True)
    else:
        cache = output.escape(str(result.path.parent.parent))
        out.print(f"[bold green]demo done[/]: cache at {output.escape(str(cache))}", soft_wrap=True)
        out.print("next: rlds list; rlds inspect demo (the README walks on from here)")
