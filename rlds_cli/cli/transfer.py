"""A cached dataset written elsewhere: ``rlds export`` in another tool's format; ``rlds push`` and
``rlds pull`` to and from object storage (any fsspec URL) and Hugging Face Hub dataset repos
(``hf://datasets/ORG/REPO[/PATH]``).

The work is in :mod:`rlds_cli.export` and :mod:`rlds_cli.remote`; fsspec is imported only when a
push or pull runs.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from rlds_cli.cli import output
from rlds_cli.cli.output import (
    JsonOption,
    NameOption,
    QuietOption,
    RootOption,
    VerboseOption,
    force_option,
    handle_errors,
)


@handle_errors
def export(
    name: Annotated[str, typer.Argument(help="Dataset name in the cache (or a registry id or alias).")],
    out: Annotated[
        str,
        typer.Argument(
            help="File (d4rl, npz) or directory (torchrl, minari, lerobot, amago, rlds) to create, or "
            "(lerobot) a Hub dataset repo folder hf://datasets/ORG/REPO[/PATH][@BRANCH], committed in one "
            "commit."
        ),
    ],
    to: Annotated[
        str,
        typer.Option(
            "--to", "-t", help="Target format: torchrl, d4rl, npz, minari, lerobot, amago, robomimic or rlds."
        ),
    ] = "torchrl",
    lerobot_version: Annotated[
        str | None,
        typer.Option(
            "--lerobot-version",
            help="LeRobot layout written by --to lerobot: 3.0 (default; lerobot 0.4) or 2.1 (per-episode "
            "files, as GR00T and openpi read).",
        ),
    ] = None,
    image_codec: Annotated[
        str | None,
        typer.Option(
            "--image-codec",
            help="--to rlds: how uint8 HxWxC observations not stored as JPEG/PNG are written: png "
            "(default, lossless), jpeg or none (raw tensors).",
        ),
    ] = None,
    force: Annotated[
        bool,
        force_option(
            "Replace OUT if it is an earlier export of that format or an empty file or folder "
            "(on the Hub: another export)."
        ),
    ] = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Export a dataset to TorchRL (tensordict memmap), D4RL HDF5, npz, Minari, LeRobot, AMAGO,
    robomimic HDF5 or RLDS.

    RLDS (--to rlds): TFRecord shards with features.json and dataset_info.json, what
    tfds.builder_from_directory loads (Octo, OpenVLA), written without TensorFlow. LeRobot
    (--to lerobot): v3.0, or v2.1 with --lerobot-version 2.1.

    To a Hugging Face Hub dataset repo (--to lerobot, OUT hf://datasets/ORG/REPO[/PATH], the repo
    made first): the export is written in the cache's tmp/ folder, then its files are one commit,
    so the repo shows all of it or nothing; only changed files are sent, and an unchanged export
    sends nothing. The token comes from HF_TOKEN or `hf auth login`.

    With -q only the path (or URL) written is printed.
    """
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.catalog.registry import resolve_name
    from rlds_cli.errors import ExportError
    from rlds_cli.export import export_dataset

    options: dict[str, Any] = {}
    for flag, value, fmt, option in (
        ("--lerobot-version", lerobot_version, "lerobot", "version"),
        ("--image-codec", image_codec, "rlds", "image_codec"),
    ):
        if value is None:
            continue
        if to != fmt:
            raise ExportError(
                f"{flag} is an option of --to {fmt}, not of --to {to}",
                hint=f"drop {flag}, or export --to {fmt}",
            )
        options[option] = value
    dataset = open_dataset(resolve_name(name, root), root)
    if out.startswith("hf://"):
        _export_to_hub(
            dataset, name, out, to, root=root, force=force, json=json, quiet=quiet, options=options
        )
        return
    path = export_dataset(dataset, out, to, overwrite=force, options=options)
    if json:
        output.print_json({"name": name, "format": to, "path": str(path), "num_steps": dataset.num_steps})
    elif quiet:
        output.console.print(Text(str(path)), soft_wrap=True)
    else:
        output.console.print(
            f"exported {output.escape(name)} ({dataset.num_steps:,} steps) as {to} to "
            f"{output.escape(str(path))}",
            soft_wrap=True,
        )


def _export_to_hub(
    dataset: Any,
    name: str,
    url: str,
    to: str,
    *,
    root: Any,
    force: bool,
    json: bool,
    quiet: bool,
    options: dict[str, Any],
) -> None:
    """``rlds export NAME hf://...``: export, commit, then say what was sent."""
    from rlds_cli.export.lerobot import export_to_hub

    result = export_to_hub(dataset, url, to, root=root, force=force, options=options)
    if json:
        output.print_json(result.to_dict())
    elif quiet:
        output.console.print(Text(url), soft_wrap=True)
    elif result.up_to_date:
        output.console.print(
            f"[green]{output.escape(name)}[/]: this {to} export is already at {output.escape(url)} "
            f"({result.files} files): nothing to upload",
            soft_wrap=True,
        )
    else:
        replaced = "; the previous export was replaced" if result.replaced else ""
        output.console.print(
            f"exported {output.escape(name)} ({result.num_steps:,} steps) as {to} to {output.escape(url)}: "
            f"{result.uploaded} of {result.files} files, {output.human_bytes(result.bytes_uploaded)} "
            f"uploaded in one commit{replaced}",
            soft_wrap=True,
        )


StorageOptions = Annotated[
    list[str] | None,
    typer.Option(
        "--storage-option",
        metavar="KEY=VALUE",
        help="An option of the store's fsspec filesystem (repeatable; values read as JSON "
        "when they parse), e.g. --storage-option anon=true.",
        show_default=False,
    ),
]
EndpointOption = Annotated[
    str | None,
    typer.Option(
        "--endpoint-url",
        metavar="URL",
        help="An S3-compatible server (MinIO, Ceph, a local test server); default: $AWS_ENDPOINT_URL, "
        "else AWS.",
        show_default=False,
    ),
]


@handle_errors
def push(
    name: Annotated[str, typer.Argument(help="A dataset in the cache (or a registry alias).")],
    url: Annotated[
        str,
        typer.Argument(
            help="Its folder on the store: s3://bucket/prefix/NAME, file:///dir/NAME, "
            "hf://datasets/ORG/REPO/NAME, ..."
        ),
    ],
    force: Annotated[
        bool,
        force_option("Replace another version already at URL; the same version: upload every file again."),
    ] = False,
    storage_option: StorageOptions = None,
    endpoint_url: EndpointOption = None,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Copy a dataset to object storage (any fsspec URL), manifest last.

    Every file goes first, then the manifest: a URL without a manifest is no dataset, so a push
    killed half way never looks complete. Run it again to resume (files already uploaded whole
    are skipped). Credentials come from the store's own configuration (for S3:
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE...). Needs the extra: pip install
    'rlds-cli[remote]'.

    To a Hugging Face Hub dataset repo (hf://datasets/ORG/REPO[/PATH][@BRANCH], the repo made
    first): the push is one commit of the files that changed, so readers never see half of it and
    an unchanged dataset sends nothing; the token comes from HF_TOKEN or `hf auth login`.

    Example: rlds push hopper-medium-v2 s3://my-bucket/rlds/hopper-medium-v2
    """
    from rlds_cli.remote.push import push as run_push

    refuse_memory_store(url)
    _report(
        run_push, name, url, verb="uploading", force=force, storage_option=storage_option,
        endpoint_url=endpoint_url, root=root, json=json, quiet=quiet,
    )  # fmt: skip


@handle_errors
def pull(
    url: Annotated[
        str,
        typer.Argument(
            help="A pushed dataset's folder: s3://bucket/prefix/NAME, hf://datasets/ORG/REPO/NAME, ..."
        ),
    ],
    name: NameOption = None,
    force: Annotated[
        bool, force_option("Replace the dataset of that name in the cache (the same version: pull it again).")
    ] = False,
    storage_option: StorageOptions = None,
    endpoint_url: EndpointOption = None,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Download a pushed dataset into the cache, checked, published atomically.

    Every file is checked against the size and sha256 the push recorded, and the content digests
    of the manifest are recomputed before the dataset appears in the cache (under the name it was
    pushed with, or --name). A pull killed half way leaves nothing visible; run it again to
    continue where it stopped. From the Hub (hf://datasets/ORG/REPO[/PATH][@REVISION]) every file
    is read at the one commit the revision points at when the pull starts.

    Example: rlds pull s3://my-bucket/rlds/hopper-medium-v2
    """
    from rlds_cli.remote.pull import pull as run_pull

    refuse_memory_store(url)
    _report(
        run_pull, url, name, verb="downloading", force=force, storage_option=storage_option,
        endpoint_url=endpoint_url, root=root, json=json, quiet=quiet,
    )  # fmt: skip


def _report(
    run: Callable[..., Any],
    *args: str | None,
    verb: str,
    force: bool,
    storage_option: list[str] | None,
    endpoint_url: str | None,
    root: Path | None,
    json: bool,
    quiet: bool,
) -> None:
    """Run a push or pull (``run(*args, ...)``) under a progress bar (``verb``), then say what it
    did: the JSON document, the one name of ``-q`` (a push's URL, a pull's cache name), or a line."""
    from rlds_cli.remote.push import PushResult
    from rlds_cli.remote.store import parse_storage_options

    options = parse_storage_options(storage_option)
    with _transfer_progress(not (json or quiet), verb) as progress:
        result = run(*args, root=root, force=force, storage_options=options, endpoint_url=endpoint_url,
                     progress=progress)  # fmt: skip
    row, pushed = result.to_dict(), isinstance(result, PushResult)
    if not pushed and result.replaced:
        output.warn_stale_children(root, result.name)
    if json:
        output.print_json(row)
    elif quiet:
        output.console.print(Text(result.url if pushed else result.name), soft_wrap=True)
    else:
        output.console.print(_line(result, row, pushed=pushed), soft_wrap=True)


def refuse_memory_store(url: str) -> None:
    """A ``memory://`` store lives in one process: a command would push into a store that is gone
    when it exits (and report success), or pull from one that is always empty."""
    from rlds_cli.errors import RemoteAccessError

    if any(part.startswith("memory://") for part in url.split("::")):
        raise RemoteAccessError(
            f"{url}: a memory:// store lives inside one process and is gone when this command exits",
            hint="use a store that outlives the command (file:///DIR/NAME, s3://bucket/prefix/NAME, "
            "hf://datasets/ORG/REPO/NAME); memory:// works from Python, within one process",
        )


def _line(result: Any, row: dict[str, Any], *, pushed: bool) -> str:
    """The line a push or a pull ends with: nothing to do, or what moved."""
    name, url = output.escape(result.name), output.escape(result.url)
    if pushed and result.up_to_date:
        return (
            f"[green]{name}[/]: already at {url} ({result.files} files, "
            f"{output.human_bytes(result.bytes_total)}): nothing to upload"
        )
    if pushed:
        return f"[green]pushed {name}[/] to {url}: {_summary(row, 'uploaded')}"
    if result.up_to_date:
        return (
            f"[green]{name}[/]: the cache already holds this version of {url} (every file at its pushed "
            f"size; 'rlds verify {name}' checks their content, --force pulls it again)"
        )
    digests = "content digests checked" if result.digests_checked else "no content digests recorded"
    return f"[green]pulled {name}[/] from {url}: {_summary(row, 'downloaded')}; {digests}"


def _summary(row: dict[str, Any], verb: str) -> str:
    """``6 of 9 files, 309.4 KiB uploaded in 0.1 s, 3.0 MiB/s (3 already there, complete)``."""
    moved = row[f"bytes_{verb}"]
    rate = f", {output.human_bytes(moved / row['seconds'])}/s" if row["seconds"] > 0 and moved else ""
    text = f"{row[verb]} of {row['files']} files, {output.human_bytes(moved)} {verb}"
    text += f" in {row['seconds']:.1f} s{rate}"
    if row["skipped"]:
        text += f" ({row['skipped']} already there, complete)"
    if row["replaced"]:
        text += "; the previous version was replaced"
    return text


def _transfer_progress(enabled: bool, label: str) -> AbstractContextManager[Callable[[str, int], None]]:
    """A byte progress bar while a transfer runs."""
    from rich.progress import DownloadColumn, TimeRemainingColumn

    return output.counting_progress(enabled, label, DownloadColumn(), TimeRemainingColumn())
