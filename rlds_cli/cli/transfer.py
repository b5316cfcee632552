"""``rlds push`` and ``rlds pull``: datasets to and from object storage (any fsspec URL) and
Hugging Face Hub dataset repos (``hf://datasets/ORG/REPO[/PATH]``).

The work is in :mod:`rlds_cli.remote`; this module parses options and renders results.
fsspec is imported only when one of these commands runs.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from rlds_cli.cli import output
from rlds_cli.cli.options import JsonOption, NameOption, QuietOption, RootOption, VerboseOption, force_option
from rlds_cli.cli.output import handle_errors

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
    force: Annotated[bool, force_option("Replace another version already at URL.")] = False,
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

    _refuse_memory(url)
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
    force: Annotated[bool, force_option("Replace a different dataset of that name in the cache.")] = False,
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

    _refuse_memory(url)
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
    if json:
        output.print_json(row)
    elif quiet:
        output.console.print(Text(result.url if pushed else result.name), soft_wrap=True)
    else:
        output.console.print(_line(result, row, pushed=pushed), soft_wrap=True)


def _refuse_memory(url: str) -> None:
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
        return f"[green]{name}[/]: the cache already holds this version of {url}"
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
