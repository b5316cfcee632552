"""``rlds preprocess``: apply a function to a cached dataset (see docs/preprocessing.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, redirect_stdout
from typing import Annotated, Any

import typer
from rich.progress import (
    MofNCompleteColumn,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from rlds_cli.cli import output
from rlds_cli.cli.output import (
    JsonOption,
    QuietOption,
    RootOption,
    VerboseOption,
    force_option,
    handle_errors,
)


class _StepsPerSecond(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} steps/s" if speed else "- steps/s", style="progress.data.speed")


def _progress(enabled: bool) -> AbstractContextManager[Callable[[str, int], None]]:
    """A progress callback for :func:`rlds_cli.preprocess.run`."""
    columns = (MofNCompleteColumn(), TextColumn("steps"), _StepsPerSecond(), TimeElapsedColumn(),
               TimeRemainingColumn())  # fmt: skip
    notes = {"resume": lambda done: f"resuming: {done:,} steps already done"}
    return output.counting_progress(enabled, "preprocessing", *columns, notes=notes)


def _print_schema(title: str, fields: dict[str, Any]) -> None:
    rows = []
    for key, spec in fields.items():
        where = {"flat": "once + final per episode (key and next/key)", "step": "per step"}.get(
            spec.get("storage", ""), "-"
        )
        rows.append([key, str(tuple(spec["shape"])), spec["dtype"], where])
    output.print_table(
        [
            output.Column("key", kind="key"),
            output.Column("shape", kind="fixed"),
            output.Column("dtype", kind="fixed"),
            output.Column("stored as"),
        ],
        rows,
        title=title,
    )


@handle_errors
def preprocess(
    name: Annotated[
        str,
        typer.Argument(
            help="The dataset to read (never modified; or a registry alias), or a pushed zarr dataset's URL."
        ),
    ],
    fn: Annotated[
        str, typer.Option("--fn", help="The function: 'package.module:func' or 'path/to/file.py:func'.")
    ],
    out: Annotated[
        str | None,
        typer.Option(
            "--name",
            "-n",
            help="Name of the new dataset in the cache, or a URL to push it to (no shared disk needed).",
            show_default=False,
        ),
    ] = None,
    by: Annotated[
        str, typer.Option("--by", help="Chunks of steps (step) or whole episodes (episode).")
    ] = "step",
    stats: Annotated[
        bool, typer.Option("--stats", help="Store mean/std/min/max/quantiles of every numeric key.")
    ] = False,
    workers: Annotated[
        int | None, typer.Option("--workers", "-w", min=1, help="Worker processes (default: all cores).")
    ] = None,
    chunk_steps: Annotated[int | None, typer.Option("--chunk-steps", min=1, help="Steps per chunk.")] = None,
    keys: Annotated[
        list[str] | None, typer.Option("--key", "-k", help="Input key to read (repeatable; default: all).")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Keep the chunks an interrupted run finished.")
    ] = False,
    force: Annotated[bool, force_option("Replace an existing output dataset.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Run the function on a small first chunk; show the schema.")
    ] = False,
    num_frames: Annotated[
        int | None, typer.Option("--num-frames", min=1, help="Process only the first N steps (debugging).")
    ] = None,
    executor: Annotated[
        str | None,
        typer.Option("--executor", help="Where chunks run: local (default) or ray.", show_default=False),
    ] = None,
    address: Annotated[
        str | None,
        typer.Option(
            "--address",
            help="Ray cluster address (with --executor ray; default: RAY_ADDRESS, else a local instance).",
        ),
    ] = None,
    storage: Annotated[
        str | None, typer.Option("--storage", help="Output storage: memmap or zarr (default: the input's).")
    ] = None,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Apply a function to every chunk of a dataset and store the result as a new dataset.

    The function gets one chunk: a dict of numpy arrays (TED keys: observation, next/observation,
    action, next/reward, next/terminated, next/truncated, next/done, episode, index, ...), the
    arrays possibly read-only. It returns a mapping of TED keys to arrays with one row per step:
    that mapping is the new dataset (keys left out are dropped, new keys are stored). action and
    next/reward are required; next/done, episode and index are derived and not stored; a key K
    returned with next/K must satisfy next/K[t] == K[t+1] inside each episode. With --by step the
    function keeps every step; with --by episode it gets whole episodes and may drop steps. Every
    chunk must return the same keys, shapes and dtypes. With -q only the new name is printed.
    """
    from rlds_cli._util.cpus import unquiet_blas

    unquiet_blas()  # the user's function, run here with --workers 1, keeps BLAS's threads
    from rlds_cli import preprocess as pp
    from rlds_cli.cache.layout import is_url
    from rlds_cli.catalog.registry import resolve_name
    from rlds_cli.cli.transfer import refuse_memory_store
    from rlds_cli.errors import PreprocessError, UserFunctionError

    for url in (name, out or ""):
        refuse_memory_store(url)  # the store would be gone when the command exits
    name = name if is_url(name) else resolve_name(name, root)
    common: dict[str, Any] = {
        "by": by, "chunk_steps": chunk_steps, "keys": keys or None, "stats": stats,
        "num_frames": num_frames, "storage": storage, "root": root,
    }  # fmt: skip
    try:
        if dry_run:
            with _user_output_to_stderr():
                info = pp.dry_run(name, fn, **common)
            if not quiet or json:  # -q: the exit status says whether the function works
                _show_dry_run(info, json)
            return
        if out is None:
            raise PreprocessError(
                "--name NAME (the new dataset's name) is required, or --dry-run",
                hint=f"e.g. --name {name}-normalized",
            )
        with _progress(enabled=not (quiet or json)) as progress, _user_output_to_stderr():
            result = pp.run(
                name, fn, out, workers=workers, backend=executor or "local", ray_address=address,
                resume=resume, force=force, progress=progress, **common,
            )  # fmt: skip
    except UserFunctionError as exc:
        if exc.user_traceback:
            output.err_console.print(Text(exc.user_traceback.rstrip()), soft_wrap=True)
        raise
    if force and not result.reused and result.url is None:
        output.warn_stale_children(root, result.manifest.name)
    _show_result(result, json, quiet)


@contextmanager
def _user_output_to_stderr() -> Iterator[None]:
    """While the user's function runs, what it prints (Python or C level, in this process or a
    worker started here) goes to stderr: stdout carries only the command's result (--json)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout at all
        yield
        return
    os.dup2(2, 1)
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _show_dry_run(info: Any, json: bool) -> None:
    if json:
        output.print_json(
            {
                "by": info.by,
                "steps": info.steps,
                "num_chunks": info.num_chunks,
                "sample_steps_in": info.sample_steps_in,
                "sample_steps_out": info.sample_steps_out,
                "input": info.input,
                "output": info.output,
                "lineage": info.lineage,
            }
        )
        return
    out = output.console
    out.print(
        f"dry run: the function turned {info.sample_steps_in:,} input steps into {info.sample_steps_out:,}; "
        f"the job would process {info.steps:,} steps in {info.num_chunks:,} chunks (by {info.by})"
    )
    _print_schema("output schema", info.output)


def _show_result(result: Any, json: bool, quiet: bool) -> None:
    m = result.manifest
    if json:
        output.print_json(
            {
                "name": m.name,
                "path": result.url or str(result.path),
                "reused": result.reused,
                "num_steps": m.num_steps,
                "num_episodes": m.num_episodes,
                "num_chunks": result.num_chunks,
                "resumed_chunks": result.resumed_chunks,
                "seconds": round(result.seconds, 3),
                "fields": {k: s.to_dict() for k, s in m.fields.items()},
                "lineage": m.lineage,
                "stats": m.stats,
            }
        )
        return
    if quiet:
        output.console.print(Text(m.name), soft_wrap=True)
        return
    if result.reused:
        output.console.print(
            f"[green]{m.name}[/]: already made by the same job from the same input (nothing to do; "
            "--force rebuilds it)",
            soft_wrap=True,
        )
        return
    resumed = f", {result.resumed_chunks} resumed" if result.resumed_chunks else ""
    rate = m.conversion.get("source_rows", m.num_steps) / max(result.seconds, 1e-9)
    output.console.print(
        f"[green]{m.name}[/]: {output.count(m.num_steps, 'step')}, "
        f"{output.count(m.num_episodes, 'episode')} from "
        f"{result.num_chunks} chunks{resumed} in {result.seconds:.1f} s ({rate:,.0f} steps/s) "
        f"-> {output.escape(result.url or str(result.path))}",
        soft_wrap=True,
    )
