"""``rlds push NAME hf://datasets/ORG/REPO[/PATH]``: a dataset into a Hub dataset repo, one commit,
with the files that describe it (the card, Croissant).

The push is one Hub commit (``HfApi.create_commit``): the data files, the files index
(``rlds-files.json``) and the manifest appear on the branch together or not at all, and a push
killed during its uploads leaves the branch unchanged. The commit names its parent (the branch's
head when the push started): if another commit landed meanwhile the Hub refuses it.

Only what changed is sent: the branch's files under ``PATH`` are listed (``HfApi.list_repo_tree``)
and a file whose size and sha256 (the LFS sha256 the Hub publishes, or a small file's git blob id)
equal the local file's gets no operation; an unchanged dataset uploads nothing and makes no commit.
LFS objects an interrupted push uploaded stay on the Hub and are not sent again. rlds compares
files itself because the counts and progress total are needed before the upload, while the
client decides only during it, after reading every file whole; the listing also finds another
version and the old files the commit deletes.

:func:`push_hub_folder` makes the same kind of commit of a folder that is not a cached dataset (a
LeRobot export, :mod:`rlds_cli.export.lerobot`).

The token is the client's (``HF_TOKEN`` or its token file); no message here holds it.

**Card files**: ``README.md`` (the dataset card: YAML front matter, then text) and
``croissant.json`` (Croissant 1.0 JSON-LD). The front matter holds what the Hub reads
(``license``, ``tags``, ``pretty_name``, ``size_categories``) and ``robot_type``, ``fps``,
``citation``, ``lineage`` (the parent datasets, each with its manifest digest) and ``statistics``
(steps, episodes, keys), written as JSON scalars and flow lists (valid YAML, no YAML library
needed). Croissant's ``distribution`` has one ``cr:FileObject`` per pushed file with its sha256;
there is no ``recordSet`` (Croissant's extractors read CSV, JSON and Parquet, not ``.npy``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlds_cli._util.io import sha256_file
from rlds_cli._util.progress import Progress
from rlds_cli.cache.card import licenses_of
from rlds_cli.cache.layout import (
    ARRAYS_DIR,
    COMMIT_LOG_FILE,
    EPISODES_FILE,
    LOG_CHECKPOINT_FILE,
    MANIFEST_FILE,
    SEGMENTED_LAYOUT,
    SEGMENTS_DIR,
    SOURCE_ARRAYS_FILE,
)
from rlds_cli.cache.manifest import Manifest, parse_manifest
from rlds_cli.errors import DatasetReplacedError, RemoteAccessError, RemoteExistsError
from rlds_cli.net.hub import HubPath, git_blob_id, hf_api, parse_hf_url
from rlds_cli.remote import store
from rlds_cli.remote.store import (
    INDEX_FILE,
    FileEntry,
    RemoteIndex,
    head_commit,
    manifest_sha256,
    translated,
)

if TYPE_CHECKING:
    from huggingface_hub import RepoFile


#: The files this module writes, by name.
README_FILE = "README.md"
CROISSANT_FILE = "croissant.json"

#: The JSON-LD context of Croissant 1.0 as mlcroissant, its reference implementation, writes and
#: expects it (``mlcroissant/_src/core/rdf.py``; another context only draws a warning).
CROISSANT_CONTEXT: dict[str, Any] = {
    "@language": "en",
    "@vocab": "https://schema.org/",
    "citeAs": "cr:citeAs",
    "column": "cr:column",
    "conformsTo": "dct:conformsTo",
    "cr": "http://mlcommons.org/croissant/",
    "rai": "http://mlcommons.org/croissant/RAI/",
    "data": {"@id": "cr:data", "@type": "@json"},
    "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "dct": "http://purl.org/dc/terms/",
    "equivalentProperty": "cr:equivalentProperty",
    "examples": {"@id": "cr:examples", "@type": "@json"},
    "extract": "cr:extract",
    "field": "cr:field",
    "fileProperty": "cr:fileProperty",
    "fileObject": "cr:fileObject",
    "fileSet": "cr:fileSet",
    "format": "cr:format",
    "includes": "cr:includes",
    "isLiveDataset": "cr:isLiveDataset",
    "jsonPath": "cr:jsonPath",
    "key": "cr:key",
    "md5": "cr:md5",
    "parentField": "cr:parentField",
    "path": "cr:path",
    "recordSet": "cr:recordSet",
    "references": "cr:references",
    "regex": "cr:regex",
    "repeated": "cr:repeated",
    "replace": "cr:replace",
    "samplingRate": "cr:samplingRate",
    "sc": "https://schema.org/",
    "separator": "cr:separator",
    "source": "cr:source",
    "subField": "cr:subField",
    "transform": "cr:transform",
}


def _size_category(steps: int) -> str:
    """The Hub's ``size_categories`` bucket of a number of rows."""
    for limit, label in (
        (1_000, "n<1K"),
        (10_000, "1K<n<10K"),
        (100_000, "10K<n<100K"),
        (1_000_000, "100K<n<1M"),
        (10_000_000, "1M<n<10M"),
        (100_000_000, "10M<n<100M"),
        (1_000_000_000, "100M<n<1B"),
        (10_000_000_000, "1B<n<10B"),
        (100_000_000_000, "10B<n<100B"),
        (1_000_000_000_000, "100B<n<1T"),
    ):
        if steps < limit:
            return label
    return "n>1T"


def front_matter(manifest: Manifest, card: dict[str, Any]) -> dict[str, Any]:
    """The card's YAML front matter, as a mapping of JSON values."""
    licenses = licenses_of(card)
    meta: dict[str, Any] = {
        "license": licenses[0].lower()
        if len(licenses) == 1
        else [lic.lower() for lic in licenses] or "unknown",
        "pretty_name": manifest.name,
        "tags": [
            "rlds",
            "offline-rl",
            "reinforcement-learning",
            *(["robotics"] if card.get("robot_type") else []),
        ],
        "size_categories": [_size_category(manifest.num_steps)],
    }
    for key in ("robot_type", "fps", "citation"):
        if card.get(key) is not None:
            meta[key] = card[key]
    if manifest.lineage:
        meta["lineage"] = [
            {"name": p.get("name"), "digest": p.get("digest"), "op": p.get("op", "derived")}
            for p in manifest.lineage
        ]
    meta["statistics"] = {
        "num_steps": manifest.num_steps,
        "num_episodes": manifest.num_episodes,
        "keys": {k: {"shape": list(s.shape), "dtype": s.dtype} for k, s in manifest.fields.items()},
    }
    return meta


def _yaml(value: Any, indent: int = 0) -> list[str]:
    """``value`` (a mapping) as block YAML whose scalars and lists are JSON (valid YAML)."""
    pad = "  " * indent
    lines: list[str] = []
    for key, item in value.items():
        if isinstance(item, dict):
            lines.append(f"{pad}{key}:")
            lines += _yaml(item, indent + 1)
        elif isinstance(item, list) and item and isinstance(item[0], dict):
            lines.append(f"{pad}{key}:")
            for entry in item:
                inner = _yaml(entry, indent + 2)
                lines.append(f"{pad}  - {inner[0].strip()}")
                lines += inner[1:]
        else:
            lines.append(f"{pad}{key}: {_yaml_safe(json.dumps(item, ensure_ascii=False))}")
    return lines


#: Characters JSON keeps raw that a YAML reader refuses (DEL, C1 controls: "special characters are
#: not allowed") or reads as a line break or a byte-order mark; only ever inside a JSON string here.
_NOT_YAML = re.compile("[\x7f-\x9f\u2028\u2029\ufeff]")


def _yaml_safe(text: str) -> str:
    """JSON ``text`` with those characters written as ``\\uXXXX`` escapes (the same string)."""
    return _NOT_YAML.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def readme(manifest: Manifest, card: dict[str, Any], read: str) -> str:
    """The dataset card: front matter, then what the dataset is and how to read it (``read``: the
    commands, as Markdown)."""
    meta = front_matter(manifest, card)
    licenses = ", ".join(licenses_of(card)) or "not declared"
    parts = [
        "---",
        *_yaml(meta),
        "---",
        "",
        f"# {manifest.name}",
        "",
        str(
            card.get("description")
            or f"An offline-RL dataset of {manifest.num_episodes:,} episodes "
            f"({manifest.num_steps:,} steps), pushed by rlds."
        ),
        "",
        f"- **License:** {licenses}",
        *([f"- **Robot type:** {card['robot_type']}"] if card.get("robot_type") else []),
        *([f"- **Frames per second:** {card['fps']}"] if card.get("fps") is not None else []),
        "",
        f"Read it with rlds: {read}.",
    ]
    if card.get("citation"):
        parts += ["", "## Citation", "", "```", str(card["citation"]), "```"]
    return "\n".join(parts) + "\n"


def croissant(
    manifest: Manifest, card: dict[str, Any], files: dict[str, tuple[int, str]], url: str
) -> dict[str, Any]:
    """The Croissant 1.0 JSON-LD of a pushed dataset: ``files`` maps each pushed file's path to
    its size and sha256; ``url`` is where the dataset lies."""
    licenses = licenses_of(card)
    doc: dict[str, Any] = {
        "@context": CROISSANT_CONTEXT,
        "@type": "sc:Dataset",
        "conformsTo": "http://mlcommons.org/croissant/1.0",
        "name": manifest.name,
        "description": str(
            card.get("description") or f"{manifest.num_episodes} episodes, {manifest.num_steps} steps"
        ),
        "url": url,
        "license": [f"https://spdx.org/licenses/{lic}.html" for lic in licenses] if licenses else "unknown",
        "datePublished": manifest.created_at,
        "version": "1.0.0",
        "distribution": [
            {
                "@type": "cr:FileObject",
                "@id": path,
                "name": path,
                "contentUrl": path,
                "contentSize": f"{size} B",
                "encodingFormat": "application/json"
                if path.endswith(".json")
                else "application/octet-stream",
                "sha256": sha256,
            }
            for path, (size, sha256) in sorted(files.items())
        ],
    }
    if card.get("citation"):
        doc["citeAs"] = str(card["citation"])
    return doc


def card_files(
    manifest: Manifest,
    card: dict[str, Any],
    files: dict[str, tuple[int, str]],
    url: str,
    read: str | None = None,
) -> dict[str, bytes]:
    """``README.md`` and ``croissant.json`` of a dataset at ``url``, as bytes; ``read`` says how to
    read it (a pushed dataset's pull and in-place read by default)."""
    if read is None:
        read = f"`rlds pull {url}` (`--name NAME` for another name), or in place with "
        read += f'`rlds_cli.open_dataset("{url}")`'
    return {
        README_FILE: readme(manifest, card, read).encode(),
        CROISSANT_FILE: (json.dumps(croissant(manifest, card, files, url), indent=2) + "\n").encode(),
    }


@dataclass
class HubPushPlan:
    """What a push to the Hub changes: files to add (repo path -> local path or bytes) and
    files of a replaced version to delete."""

    add: dict[str, Path | bytes]
    delete: list[str]
    replaced: bool


def push_hub(
    directory: Path,
    url: str,
    *,
    name: str,
    manifest_bytes: bytes,
    local: dict[str, FileEntry],
    force: bool,
    progress: Progress | None,
) -> dict[str, Any]:
    """Push the dataset folder ``directory`` (its files ``local``, its manifest ``manifest_bytes``)
    to ``url`` as one commit; returns the counts of :class:`~rlds_cli.remote.push.PushResult`.

    Raises:
        RemoteExistsError: Another version is at ``url`` and ``force`` is false.
        RemoteAccessError: No such repo or branch, no token that may write to it, the branch
            moved during the push, the Hub unreachable.
        DatasetReplacedError: The local dataset was rebuilt during the push (nothing committed).
    """
    where, parent = _branch_head(url)
    remote = _remote_files(where, parent)
    plan = plan_push(where, directory, manifest_bytes, local, remote, force, url)
    sent = [rel for rel in local if _repo_path(where, rel) in plan.add]
    counts: dict[str, Any] = {
        "uploaded": len(sent),
        "skipped": len(local) - len(sent),
        "bytes_uploaded": sum(local[rel].size for rel in sent),
        "replaced": plan.replaced,
        "up_to_date": not plan.add and not plan.delete,
    }
    if counts["up_to_date"]:
        return counts  # nothing changed: no upload, no commit
    if progress is not None:
        progress("start", counts["bytes_uploaded"])

    def check(adds: list[Any]) -> None:
        _check_unchanged(directory, manifest_bytes, local, adds, where, name, url)

    _commit(where, url, plan, parent, f"rlds push {name}", check)
    if progress is not None:
        progress("advance", counts["bytes_uploaded"])
    return counts


def push_hub_folder(
    directory: Path,
    url: str,
    *,
    message: str,
    marker: str,
    owned: Callable[[str], bool],
    force: bool,
) -> dict[str, Any]:
    """Commit the files of ``directory`` (a folder this process wrote, not a cached dataset) to
    ``url`` as :func:`push_hub` does: changed files only, no commit when nothing changed, the
    commit's parent the branch's head.

    Args:
        directory: The folder whose every file is pushed (paths relative to it).
        url: ``hf://datasets/ORG/REPO[/PATH][@BRANCH]``.
        message: The commit message.
        marker: The file that tells one version from another (``meta/info.json``): when the
            branch holds another, the push replaces it only with ``force``.
        owned: Which of the branch's files under ``PATH`` belong to the pushed format: those the
            folder lacks are deleted in the same commit (a README beside them stays). Without
            ``marker`` there, such files are another dataset's: deleted only with ``force``.
        force: Replace another version (or delete those files).

    Returns:
        ``files``, ``uploaded``, ``skipped``, ``bytes_uploaded``, ``replaced``, ``up_to_date``.

    Raises:
        RemoteExistsError: Another version is at ``url``, or files under the owned folders and
            no ``marker``, and ``force`` is false.
        RemoteAccessError: As :func:`push_hub`.
    """
    where, parent = _branch_head(url)
    remote = _remote_files(where, parent)
    local = {
        p.relative_to(directory).as_posix(): FileEntry(p.stat().st_size, sha256_file(p))
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
    there = remote.get(marker)
    stale = [rel for rel in sorted(remote) if rel not in local and owned(rel)]
    if there is not None:
        mine = directory / marker
        replaced = marker not in local or not _unchanged(there, local[marker], mine.read_bytes)
        if replaced and not force:
            raise RemoteExistsError(f"{url} holds another version (its {marker} differs)")
    else:  # no marker: files there under the owned folders are someone else's, not an old version
        replaced = bool(stale)
        if not force:
            store.refuse_foreign(
                url,
                stale,
                "export",
                marker,
                hint="pass --force to delete them in the export's commit, or export to a folder of the "
                "repo: hf://datasets/ORG/REPO/PATH",
            )
    add: dict[str, Path | bytes] = {
        _repo_path(where, rel): directory / rel
        for rel, entry in local.items()
        if not _unchanged(remote.get(rel), entry, (directory / rel).read_bytes)
    }
    delete = [_repo_path(where, rel) for rel in stale]
    sent = [rel for rel in local if _repo_path(where, rel) in add]
    counts: dict[str, Any] = {
        "files": len(local),
        "uploaded": len(sent),
        "skipped": len(local) - len(sent),
        "bytes_uploaded": sum(local[rel].size for rel in sent),
        "replaced": replaced,
        "up_to_date": not add and not delete,
    }
    if not counts["up_to_date"]:
        _commit(where, url, HubPushPlan(add, delete, replaced), parent, message, None)
    return counts


def check_branch(url: str) -> None:
    """Raise what a push to ``url`` would raise at its start (a commit rather than a branch, no
    such repo or branch, a repo the token may not read), before a long export is written for it.
    A token that may read but not write is refused only at the upload, before any commit."""
    _branch_head(url)


def _branch_head(url: str) -> tuple[HubPath, str]:
    """``url`` parsed, and the commit its branch points at (the push's parent)."""
    where = parse_hf_url(url)
    if _is_sha(where.revision):
        raise RemoteAccessError(
            f"cannot push to {url}: {where.revision[:12]}... is a commit, not a branch",
            hint="push to a branch: hf://datasets/ORG/REPO[/PATH] (main) or ...@BRANCH",
        )
    return where, head_commit(where, write=True)


def plan_push(
    where: HubPath,
    directory: Path,
    manifest_bytes: bytes,
    local: dict[str, FileEntry],
    remote: dict[str, RepoFile],
    force: bool,
    url: str,
) -> HubPushPlan:
    """The operations of a push: every local file the branch does not hold unchanged, the index,
    manifest and card files when they differ, and (replacing another version) its data files."""
    index = RemoteIndex(manifest_sha256(manifest_bytes), local, store.INDEX_BLOCK_BYTES).to_json()
    replaced = MANIFEST_FILE in remote and not _unchanged_bytes(remote[MANIFEST_FILE], manifest_bytes)
    if replaced and not force:
        raise RemoteExistsError(f"{url} holds another version of a dataset (its {MANIFEST_FILE} differs)")
    if MANIFEST_FILE not in remote and not force:  # a push commits its manifest with its files
        store.refuse_foreign(
            url,
            sorted(rel for rel in remote if _is_dataset_file(rel) or rel == INDEX_FILE),
            "push",
            MANIFEST_FILE,
            hint="push to a folder of the repo of its own (hf://datasets/ORG/REPO/PATH), or pass --force "
            "to write over them and delete the rest in the push's commit",
        )
    add: dict[str, Path | bytes] = {
        _repo_path(where, rel): directory / rel
        for rel, entry in sorted(local.items())
        if not _unchanged(remote.get(rel), entry, (directory / rel).read_bytes)
    }
    # the dataset card and its Croissant metadata, written from the manifest
    manifest = parse_manifest(manifest_bytes, url)
    if manifest.layout == SEGMENTED_LAYOUT:  # its manifest counts nothing: its log does
        from rlds_cli.cache.growing import GrowingDataset

        grown = GrowingDataset(directory)
        manifest = replace(manifest, num_steps=grown.num_steps, num_episodes=grown.num_episodes)
    described = {rel: (entry.size, entry.sha256) for rel, entry in local.items()}
    cards = card_files(manifest, manifest.card, described, url)
    if README_FILE in remote and not force:  # a README already there is the repo owner's
        del cards[README_FILE]
    for rel, data in ((INDEX_FILE, index), (MANIFEST_FILE, manifest_bytes), *cards.items()):
        if not _unchanged_bytes(remote.get(rel), data):
            add[_repo_path(where, rel)] = data
    delete = [
        _repo_path(where, rel)
        for rel in sorted(remote)
        if rel not in local and rel not in (INDEX_FILE, MANIFEST_FILE) and _is_dataset_file(rel)
    ]
    return HubPushPlan(add, delete, replaced)


def _commit(
    where: HubPath,
    url: str,
    plan: HubPushPlan,
    parent: str,
    message: str,
    check: Callable[[list[Any]], None] | None,
) -> None:
    """Upload the new files (LFS objects first), ``check`` the uploads (a cached dataset: it did
    not change under the push), then make the commit."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    api = hf_api()
    adds = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=_source(v)) for p, v in plan.add.items()]
    deletes = [CommitOperationDelete(path_in_repo=p) for p in plan.delete]
    with _quiet_client(), translated(url, write=True):
        api.preupload_lfs_files(where.repo, additions=adds, repo_type="dataset", revision=where.revision)
        if check is not None:
            check(adds)
        api.create_commit(
            where.repo,
            operations=[*adds, *deletes],
            commit_message=message,
            repo_type="dataset",
            revision=where.revision,
            parent_commit=parent,
        )


def _check_unchanged(
    directory: Path,
    manifest_bytes: bytes,
    local: dict[str, FileEntry],
    adds: list[Any],
    where: HubPath,
    name: str,
    url: str,
) -> None:
    """Refuse to commit when the local dataset changed after its files were hashed: its manifest
    was rewritten, or an uploaded file's sha256 is not the one the index records."""
    try:
        same = (directory / MANIFEST_FILE).read_bytes() == manifest_bytes
    except OSError:
        same = False
    by_path = {_repo_path(where, rel): e for rel, e in local.items()}
    for op in adds:
        entry = by_path.get(op.path_in_repo)
        info = op.upload_info
        if entry is not None and (
            info.size != entry.size or (info.is_hashed and info.sha256.hex() != entry.sha256)
        ):
            same = False
    if not same:
        raise DatasetReplacedError(
            f"dataset {name!r} was replaced or changed in the cache during the push; nothing was committed "
            f"at {url}",
            hint="run the push again once the dataset is no longer being rebuilt",
        )


def _remote_files(where: HubPath, sha: str) -> dict[str, RepoFile]:
    """The branch's files under ``where.path`` at ``sha``, by path relative to it."""
    from huggingface_hub import RepoFile
    from huggingface_hub import errors as hf_errors

    prefix = f"{where.path}/" if where.path else ""
    with translated(str(where), write=True):
        try:
            entries = list(
                hf_api().list_repo_tree(
                    where.repo, path_in_repo=where.path or None, recursive=True, revision=sha,
                    repo_type="dataset",
                )
            )  # fmt: skip
        except hf_errors.EntryNotFoundError:
            return {}  # a folder not there yet
    return {
        e.path[len(prefix) :]: e for e in entries if isinstance(e, RepoFile) and e.path.startswith(prefix)
    }


def _unchanged(there: RepoFile | None, entry: FileEntry, read: Callable[[], bytes]) -> bool:
    """Whether the branch's file ``there`` holds the local bytes ``entry`` describes: the LFS
    sha256 the Hub lists, or for a file kept in git its blob id (of the bytes ``read`` returns)."""
    if there is None or there.size != entry.size:
        return False
    if there.lfs is not None:
        return there.lfs.sha256 == entry.sha256
    return there.blob_id == git_blob_id(read())


def _unchanged_bytes(there: RepoFile | None, data: bytes) -> bool:
    return _unchanged(there, FileEntry(len(data), hashlib.sha256(data).hexdigest()), lambda: data)


def _is_dataset_file(rel: str) -> bool:
    """A file rlds writes in a dataset folder, growing datasets' included (a replaced version's
    leftover is deleted; a README or ``.gitattributes`` beside the dataset is the repo owner's and
    stays)."""
    return rel.startswith((f"{ARRAYS_DIR}/", f"{SEGMENTS_DIR}/")) or rel in (
        EPISODES_FILE, SOURCE_ARRAYS_FILE, COMMIT_LOG_FILE, LOG_CHECKPOINT_FILE,
    )  # fmt: skip


def _repo_path(where: HubPath, rel: str) -> str:
    return f"{where.path}/{rel}" if where.path else rel


def _source(value: Path | bytes) -> str | bytes:
    return str(value) if isinstance(value, Path) else value


def _is_sha(revision: str) -> bool:
    return len(revision) == 40 and all(c in "0123456789abcdef" for c in revision)


@contextmanager
def _quiet_client() -> Iterator[None]:
    """Silence the client's progress bars and retry warnings while it uploads (rlds never prints;
    the CLI draws its own bar), restoring them after."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
        logging,
    )

    was, level = are_progress_bars_disabled(), logging.get_verbosity()
    disable_progress_bars()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if not was:
            enable_progress_bars()
