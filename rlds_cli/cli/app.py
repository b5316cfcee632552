"""The ``rlds`` application: registers the commands, and nothing heavy at import time
(``rlds --help`` must not import torch, zarr or h5py)."""

from __future__ import annotations

from typing import Annotated

import typer

from rlds_cli._version import __version__
from rlds_cli.cli.datasets import info, inspect, list_datasets, score, stats
from rlds_cli.cli.download import demo, download, verify
from rlds_cli.cli.look import audit, show
from rlds_cli.cli.manage import compact, du, gc, path, rm
from rlds_cli.cli.preprocess import preprocess
from rlds_cli.cli.transfer import export, pull, push
from rlds_cli.cli.views import downsample, drop, merge, split, trim, view

app = typer.Typer(
    name="rlds",
    help="Offline-RL datasets: download, convert to a TED cache, inspect, and sample fast.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rlds-cli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
    verbose: Annotated[
        int,
        typer.Option(
            "--verbose", "-v", count=True, show_default=False, help="Log what happens (-v: info, -vv: debug)."
        ),
    ] = 0,
) -> None:
    """Offline-RL datasets: download, convert to a TED cache, inspect, and sample fast."""
    if verbose:
        from rlds_cli.cli.output import configure_logging

        configure_logging(verbose)


app.command("download")(download)
app.command("list")(list_datasets)
app.command("inspect")(inspect)
app.command("audit")(audit)
app.command("show")(show)
app.command("demo")(demo)
app.command("preprocess")(preprocess)
app.command("rm")(rm)
app.command("du")(du)
app.command("gc")(gc)
app.command("path")(path)
app.command("export")(export)
app.command("view")(view)
app.command("split")(split)
app.command("info")(info)
app.command("verify")(verify)
app.command("push")(push)
app.command("pull")(pull)
app.command("score")(score)
app.command("stats")(stats)
app.command("compact")(compact)
app.command("merge")(merge)
app.command("drop")(drop)
app.command("trim")(trim)
app.command("downsample")(downsample)


def main() -> None:
    """Console entry point: stdout that cannot show every character replaces it instead of
    failing, warnings and log records are one line each, without a source location, and numpy's
    OpenBLAS starts one thread (:func:`rlds_cli._util.cpus.quiet_blas`)."""
    import gc
    import os
    import warnings

    from rlds_cli._util import signals
    from rlds_cli._util.cpus import quiet_blas
    from rlds_cli.cli import output

    # the Hub client logs every retry on stderr, even when the command then succeeds; rlds
    # reports failures itself (HF_HUB_VERBOSITY=warning brings them back)
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")
    quiet_blas()  # before any command imports numpy (none is imported yet)
    output.protect_streams()
    warnings.showwarning = output.format_warning
    output.configure_logging(0)
    try:
        app()
    except KeyboardInterrupt:  # outside a command (its arguments being read): nothing was started
        output.error("interrupted")
        raise SystemExit(signals.exit_code()) from None
    finally:
        # frozen objects are skipped by the shutdown's collections (~80 ms of a 1.1 s
        # `rlds download`); files are closed (datasets published) by the commands, never by gc
        gc.freeze()


if __name__ == "__main__":
    main()
