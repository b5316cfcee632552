"""``rlds export NAME hf://datasets/ORG/REPO[/PATH] --to lerobot``: a LeRobot v3.0 export committed
to a Hub dataset repo, where LeRobot's loader (and ``rlds download hf://...``) reads it.

The export is written to a temporary folder in the cache's ``tmp/`` (removed whatever happens), then
committed to the repo in one commit by :func:`~rlds_cli.remote.hub_push.push_hub_folder` (the commit
code of ``rlds push``): the repo shows the whole export or none of it, only files that differ from
the branch's are sent, and an identical export sends nothing and makes no commit.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.layout import entry_name, new_id
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cache.snapshot import private_build
from rlds_cli.errors import ExportError

#: Formats exported to a Hub repo, and the repo folders each owns: a replaced export's file there
#: that the new one lacks is deleted, other files stay; files there with no :data:`MARKER` are
#: another dataset's, deleted only with ``force``.
HUB_FORMATS: dict[str, tuple[str, ...]] = {"lerobot": ("meta/", "data/", "videos/")}
#: The file that tells one export from another (another one there needs ``force``).
MARKER = "meta/info.json"
#: What separates the dataset's entry from the export's id in its build's name and lock.
HUB_EXPORT_MARK = "~hub-export-"


@dataclass
class HubExportResult:
    """What :func:`export_to_hub` did.

    Attributes:
        name: The dataset exported.
        url: Where the export is now.
        format: The format written.
        num_steps: Steps of the dataset.
        files: Files of the export.
        uploaded: Files this run sent.
        skipped: Files the branch already held, unchanged.
        bytes_uploaded: Bytes this run sent.
        replaced: Another export was at ``url`` and was replaced (``force``).
        up_to_date: The branch held this export already: nothing was sent, no commit was made.
    """

    name: str
    url: str
    format: str
    num_steps: int
    files: int
    uploaded: int
    skipped: int
    bytes_uploaded: int
    replaced: bool
    up_to_date: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def export_to_hub(
    dataset: Dataset,
    url: str,
    format: str = "lerobot",
    *,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    force: bool = False,
    progress: Callable[[int], None] | None = None,
    options: dict[str, Any] | None = None,
) -> HubExportResult:
    """Export ``dataset`` as ``format`` and commit it to the Hub dataset repo folder ``url``.

    Args:
        dataset: An opened dataset.
        url: ``hf://datasets/ORG/REPO[/PATH][@BRANCH]`` (the repo made first; the token from
            ``HF_TOKEN`` or the client's token file).
        format: One of :data:`HUB_FORMATS`.
        root: The cache whose ``tmp/`` holds the export until it is committed.
        force: Replace another export already at ``url`` (or delete files of another dataset
            in the folders the export owns).
        progress: As :func:`~rlds_cli.export.export_dataset`'s (steps written).
        options: The format's options, as :func:`~rlds_cli.export.export_dataset` takes them
            (``{"version": "2.1"}`` for a LeRobot v2.1 export).

    Raises:
        ExportError: ``format`` cannot be exported to the Hub.
        RemoteExistsError: Another export (or another dataset's files in the folders the
            export owns) is at ``url`` and ``force`` is false.
        RemoteAccessError: No such repo or branch, no token that may write to it, the branch
            moved during the push, the Hub unreachable.
    """
    from rlds_cli.export import export_dataset
    from rlds_cli.remote.hub_push import check_branch, push_hub_folder

    owned = HUB_FORMATS.get(format)
    if owned is None:
        raise ExportError(
            f"cannot export {format!r} to {url}: only {', '.join(HUB_FORMATS)} is exported to the Hub",
            hint="export to a local path instead, or use --to lerobot",
        )
    check_branch(url)  # a wrong URL or token says so before the export, not after it
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    # a build of its own in tmp/: removed afterwards, and by rlds gc if this process is killed
    with private_build(cache, f"{entry_name(dataset.name)}{HUB_EXPORT_MARK}{new_id()}") as tmp:
        tmp.mkdir()
        out = export_dataset(dataset, tmp / "export", format, progress=progress, options=options)
        _write_card(dataset, out, url)
        counts = push_hub_folder(
            out,
            url,
            message=f"rlds export {dataset.name} --to {format}",
            marker=MARKER,
            owned=lambda rel: rel.startswith(owned),
            force=force,
        )
    return HubExportResult(name=dataset.name, url=url, format=format, num_steps=dataset.num_steps, **counts)


def _write_card(dataset: Dataset, out: Path, url: str) -> None:
    """The dataset card (``README.md``, with the data's licence and lineage) and Croissant
    metadata of the export, beside its files (see :mod:`rlds_cli.remote.hub_push`)."""
    from rlds_cli._util.io import sha256_file
    from rlds_cli.cache.card import dataset_card
    from rlds_cli.remote.hub_push import card_files

    files = {
        p.relative_to(out).as_posix(): (p.stat().st_size, sha256_file(p))
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }
    for name, data in card_files(dataset.manifest, dataset_card(dataset), files, url).items():
        (out / name).write_bytes(data)
