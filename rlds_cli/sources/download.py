"""``rlds download``: turn a registry id, a URL or a local path into a cached dataset.

Remote files are fetched into ``<root>/raw/<entry>/`` by :mod:`rlds_cli.net` (resumed,
retried, verified, published atomically) and then converted by :func:`rlds_cli.sources.convert.convert`.
A first-seen sha256 is pinned (made binding for later downloads) only once the conversion
succeeded; a file that failed to convert is fetched again by the next run
(:mod:`rlds_cli.net.layout`).

``rlds download hf://datasets/ORG/REPO[/PATH][@REVISION]``: a Hub dataset repo into the cache.

The revision is resolved to a commit sha first, and everything after that is read at that sha
(a branch moving mid-download cannot mix two versions); the sha is recorded in the dataset's
provenance. Files land in a download folder of their own per repo, path and commit
(``<root>/raw/urls/...``), verified (:mod:`rlds_cli.net.hub`), then converted.

What a download records about its origin: the manifest's ``source`` record (:func:`provenance`)
and the default cache name (:func:`default_name`), for a registry id, a URL or a Hub repo.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

from rlds_cli import settings
from rlds_cli._util.io import atomic_write
from rlds_cli._util.progress import DownloadProgress, Progress
from rlds_cli.cache.card import make_card
from rlds_cli.cache.layout import is_url
from rlds_cli.cache.root import CacheRoot, overlap
from rlds_cli.catalog import registry
from rlds_cli.errors import (
    DownloadFailedError,
    InvalidSelectionError,
    OfflineError,
    SourceFormatError,
    SourceNotFoundError,
    UnknownFormatError,
    UnsupportedSourceError,
)
from rlds_cli.formats import detect_format, reader_class
from rlds_cli.frames.codecs import FramesMode
from rlds_cli.net.fetch import FetchResult, RemoteFile, drop_raw_files, fetch_files
from rlds_cli.net.http import HttpConfig, OriginAuth, origin_of
from rlds_cli.net.hub import (
    FolderListing,
    HubFile,
    HubPath,
    dataset_folder,
    endpoint,
    fetch_hub_files,
    hub_file,
    layout_format,
    list_folder,
    local_name,
    needed_files,
    parse_hf_url,
    read_listing,
    resolve,
    save_listing,
    token_auth,
)
from rlds_cli.net.layout import (
    HashStore,
    confirmed_by_conversion,
    in_use,
    meta_dir,
    raw_dir,
    url_dir,
    url_file_name,
)
from rlds_cli.sources.convert import ConvertResult, convert, episode_files

_URL_PREFIXES = ("http://", "https://")


#: Formats whose reader takes the dataset's folder rather than its files.
_REGISTRY_FOLDER_FORMATS = {"minari"}


def download(
    source: str | os.PathLike[str],
    *,
    name: str | None = None,
    format: str | None = None,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    backend: str | None = None,
    frames: str | FramesMode | None = None,
    force: bool = False,
    options: dict[str, Any] | None = None,
    progress: Progress | None = None,
    offline: bool | None = None,
    keep_raw: bool = True,
    sha256: str | None = None,
    download_progress: DownloadProgress | None = None,
    license: str | None = None,
    citation: str | None = None,
) -> ConvertResult:
    """Resolve ``source``, fetch and verify its files, and convert them into the cache.

    Args:
        source: A registry id or alias (``rlds list --remote``), an ``http(s)://`` URL of one
            file, a Hub dataset repo ``hf://datasets/ORG/REPO[/PATH][@REVISION]``, or a local
            path (file, folder, or archive; a str or a path object).
        name: Name in the cache (default: the registry id, or the file's stem).
        format: Source format (default: the registry's, or detected from the files).
        root: Cache root.
        backend: ``"memmap"`` or ``"zarr"`` (``None``: an existing dataset's, else memmap;
            see :func:`rlds_cli.sources.convert.convert`).
        frames: What to do with camera frames: ``keep`` (default), ``raw``, ``jpeg[:QUALITY]``,
            ``png`` or ``webp`` (see :mod:`rlds_cli.frames.codecs`).
        force: Download again and re-convert, replacing an existing dataset of that name.
        options: Reader options; registry hints (e.g. ``max_episode_steps``) fill the gaps.
        progress: Conversion progress, see :func:`rlds_cli.sources.convert.convert`.
        offline: Never touch the network (default: ``RLDS_OFFLINE``).
        keep_raw: Keep the downloaded files after conversion (their hashes are kept anyway).
        sha256: Expected sha256 of a URL or local file.
        download_progress: See :data:`rlds_cli.net.DownloadProgress`.
        license: The data's licence, an SPDX id, kept in the dataset's card (checked before
            anything is fetched); without it, what the source or the registry entry declares.
        citation: How to cite the data, kept in the card.

    Returns:
        A :class:`~rlds_cli.sources.convert.ConvertResult`.
    """
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    offline = settings.offline() if offline is None else offline
    # pin=False: a first-seen hash binds later downloads only once the file converted
    fetch: dict[str, Any] = {"force": force, "offline": offline, "progress": download_progress, "pin": False}
    make_card(license=license, citation=citation)  # an unknown licence fails before any download
    convert_args: dict[str, Any] = {
        "root": cache, "backend": backend, "frames": frames, "force": force, "progress": progress,
        "license": license, "citation": citation,
    }  # fmt: skip
    source = _normal_url(os.fspath(source) if isinstance(source, os.PathLike) else source)
    if not source.strip():  # Path("") is the working directory: never a source by accident
        raise SourceNotFoundError(
            "the source is empty", hint="give a registry id, a URL, an hf:// URL or a path ('.' for here)"
        )
    try:
        path = Path(source).expanduser()
    except RuntimeError:  # "~user/..." of no such user
        raise SourceNotFoundError(f"source {source!r}: no home folder for {source.split('/')[0]!r}") from None
    if path.exists():
        how = overlap(path, cache.path)
        if how in ("is", "holds"):  # its datasets, builds and downloads are no source
            raise SourceNotFoundError(
                f"source {path} {how} the rlds cache ({cache.path})",
                hint="give the file or folder of the dataset to convert",
            )
        return convert(
            path, name or default_name(path), format=format, options=options, expected_sha256=sha256,
            **convert_args,
        )  # fmt: skip
    if source.startswith(_URL_PREFIXES):
        return _download_url(source, name, format, sha256, options, cache, keep_raw, fetch, convert_args)
    if source.startswith("hf://"):
        from rlds_cli.sources.download import download_hub

        _refuse_sha256(sha256, source, "a Hub repo")
        return download_hub(
            source, name=name, format=format, cache=cache, options=options, force=force, offline=offline,
            keep_raw=keep_raw, convert_args=convert_args, progress=download_progress,
        )  # fmt: skip
    if not registry.is_known(source) and _looks_like_path(source):
        raise SourceNotFoundError(f"source file {path} does not exist")
    entry = registry.resolve(source)
    _refuse_sha256(sha256, source, "a registry id")
    convert_args["registry_license"] = entry.license
    convert_args["env"] = entry.env_entry()
    merged = {**entry.options, **{k: v for k, v in (options or {}).items() if v is not None}}
    if entry.is_bundled:
        file = entry.files[0]
        return convert(
            file.bundled_path(), name or entry.cache_name, format=format or entry.format, options=merged,
            source_info={"id": entry.id, "url": file.urls[0]}, expected_sha256=file.sha256,
            expected_origin="registry", **convert_args,
        )  # fmt: skip
    folder = raw_dir(cache, entry.cache_name)
    listing = folder_listing(entry, folder, offline=offline)
    planned = plan_files(entry, listing, options=merged)
    if not force:
        share_downloads(cache, entry, folder, planned)
    config = HttpConfig(auth=None if offline else _hub_auth(entry, planned))
    with in_use(folder):  # rlds gc --raw leaves the folder alone until it is converted
        results = fetch_files(planned, folder, config=config, **fetch)
        hub_record = listing.provenance() if listing is not None else {}  # the commit every file is of
        with confirmed_by_conversion(folder, [r.name for r in results]):
            result = convert(
                _convert_source(entry.format, folder, results),
                name or entry.cache_name,
                format=format or entry.format,
                options=merged,
                source_info=provenance(results, folder, id=entry.id, **hub_record),
                expected_sha256=results[0].sha256 if len(results) == 1 else None,
                expected_origin=results[0].hash_origin,
                **convert_args,
            )
        if not keep_raw:
            drop_raw_files(folder, results)
        return result


def _refuse_sha256(sha256: str | None, source: str, kind: str) -> None:
    """``--sha256`` names one file's hash: refused for a source whose files carry their own (it was
    dropped without a word, and any file converted)."""
    if sha256 is not None:
        raise InvalidSelectionError(
            f"--sha256 checks a URL or a local file; {source!r} is {kind}, whose files carry their own "
            "hashes (checked at every download)",
            hint="leave --sha256 out ('rlds verify NAME' checks the files afterwards)",
        )


def _download_url(
    url: str,
    name: str | None,
    format: str | None,
    sha256: str | None,
    options: dict[str, Any] | None,
    cache: CacheRoot,
    keep_raw: bool,
    fetch: dict[str, Any],
    convert_args: dict[str, Any],
) -> ConvertResult:
    file_name = url_file_name(url)
    folder = url_dir(cache, url)
    remote = RemoteFile(file_name, (url,), sha256=sha256.lower() if sha256 else None, hash_origin="user")
    with in_use(folder):  # rlds gc --raw leaves the folder alone until it is converted
        results = fetch_files([remote], folder, **fetch)
        with confirmed_by_conversion(folder, [r.name for r in results]):
            result = convert(
                results[0].path,
                name or default_name(Path(file_name)),
                format=format,
                options=options,
                source_info=provenance(results, folder, url=url),
                expected_sha256=results[0].sha256,
                expected_origin=results[0].hash_origin,
                **convert_args,
            )
        if not keep_raw:
            drop_raw_files(folder, results)
        return result


def plan_files(
    entry: registry.RegistryEntry, listing: FolderListing | None, options: dict[str, Any] | None = None
) -> list[RemoteFile]:
    """The files of a registry entry: its listed files, the files of its file set that the reader
    ``options`` pick (``checkpoints``), plus, for a Hub folder, the files of its ``listing``."""
    files = [
        RemoteFile(f.name, f.urls, f.size, f.sha256, "registry")
        for f in entry.files_for(options)
        if not f.is_bundled
    ]
    return files + (listing.files if listing is not None else [])


def folder_listing(entry: registry.RegistryEntry, folder: Path, *, offline: bool) -> FolderListing | None:
    """A Hub folder entry's files at one commit (``None`` for other entries): listed through
    huggingface_hub and remembered in ``.rlds/listing.json``; offline, or when the Hub cannot be
    reached, the remembered listing (its files are still verified by their hashes).

    Raises:
        OfflineError: Offline, and the folder was never listed.
    """
    lst = entry.listing
    if lst is None:
        return None
    where = HubPath(lst.hf_repo, lst.path.strip("/"), lst.revision)
    if not offline:
        try:
            listing = list_folder(lst.hf_repo, lst.path, revision=lst.revision, suffix=lst.suffix)
        except DownloadFailedError:
            try:
                known = read_listing(folder, where)
            except OfflineError:  # a damaged kept list: the Hub's failure is what to say
                known = None
            if known is not None:
                return known
            raise
        save_listing(folder, listing)
        return listing
    known = read_listing(folder, where)
    if known is None:
        raise OfflineError(f"the file list of {entry.id!r} has never been fetched and offline mode is on")
    return known


def _hub_auth(entry: registry.RegistryEntry, files: list[RemoteFile]) -> OriginAuth | None:
    """The Hub token, for an entry whose files come from the Hub (sent to the Hub's origin only;
    never written anywhere)."""
    hub = origin_of(endpoint())
    if entry.listing is None and not any(origin_of(u) == hub for f in files for u in f.urls):
        return None
    return token_auth()


def share_downloads(
    cache: CacheRoot, entry: registry.RegistryEntry, folder: Path, files: list[RemoteFile]
) -> None:
    """Link files another registry entry already downloaded from the same URL (several D4RL ids
    share one file), instead of downloading them again. The linked file is still verified
    against the hash recorded for it before it is used."""
    wanted = {f.urls[0]: f for f in files if f.urls and not (folder / f.name).exists()}
    if not wanted:
        return
    for other in registry.entries():
        their_folder = raw_dir(cache, other.cache_name)
        # (an entry never downloaded has nothing to share: its file set is not even expanded)
        if other.id == entry.id or other.is_bundled or not their_folder.is_dir():
            continue
        for theirs in other.files:
            mine = wanted.get(theirs.urls[0]) if theirs.urls else None
            source = their_folder / theirs.name
            record = HashStore(their_folder).get(theirs.name) if mine and source.is_file() else None
            # only a pinned hash is shared: an unconverted first download proves nothing
            if (
                mine is None
                or record is None
                or not record.pinned
                or (mine.sha256 and mine.sha256 != record.sha256)
            ):
                continue
            target = folder / mine.name
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)
            HashStore(folder).put(mine.name, dataclasses.replace(record, mtime_ns=0))
            del wanted[theirs.urls[0]]


def _convert_source(fmt: str, folder: Path, results: list[FetchResult]) -> Path | Sequence[Path]:
    """What to hand to :func:`convert`: the folder, the one file, or the list of files."""
    if fmt in _REGISTRY_FOLDER_FORMATS:
        return folder
    return results[0].path if len(results) == 1 else [r.path for r in results]


def _normal_url(source: str) -> str:
    """``source`` with its URL scheme in lower case (``HTTP://`` is ``http://``), a ``file://``
    URL as its local path.

    Raises:
        UnsupportedSourceError: A URL of a scheme rlds does not download (``ftp://``, ``s3://``).
    """
    if not is_url(source):
        return source
    scheme = source.split("://", 1)[0].lower()
    if scheme == "file":
        host = urlsplit(source).netloc
        if host.lower() not in ("", "localhost"):  # RFC 8089: a file of another machine
            raise UnsupportedSourceError(
                f"{source}: a file:// URL of host {host!r} names a file on another machine; rlds reads "
                "files of this one",
                hint=f"copy the file here and pass its path (file:///PATH, or file://localhost/PATH); "
                f"a path of this machine starts with a third slash: file:///{host}/...",
            )
        return url2pathname(urlsplit(source).path)
    if scheme not in ("http", "https", "hf"):
        raise UnsupportedSourceError(
            f"{source}: rlds downloads http://, https:// and hf:// URLs, not {scheme}://",
            hint="fetch the file with another tool and pass its path (a dataset pushed with 'rlds push' "
            "comes back with 'rlds pull')",
        )
    return scheme + source[len(scheme) :]


def _looks_like_path(source: str) -> bool:
    return source.startswith((".", "~", os.sep)) or bool(Path(source).suffix)


#: Formats whose reader takes the dataset's folder rather than its files (an RLDS reader reads
#: one TFDS folder: ``features.json``, ``dataset_info.json`` and the shards of one split).
_HUB_FOLDER_FORMATS = {"minari", "lerobot", "rlds"}


#: The listing of one commit, kept so that an offline re-run of a pinned sha needs no Hub.
_LISTING = "hub-listing.json"


_SHA = re.compile(r"^[0-9a-f]{40}$")


def download_hub(
    source: str,
    *,
    name: str | None,
    format: str | None,
    cache: CacheRoot,
    options: dict[str, Any] | None,
    force: bool,
    offline: bool,
    keep_raw: bool,
    convert_args: dict[str, Any],
    progress: DownloadProgress | None = None,
) -> ConvertResult:
    """Resolve, fetch, verify and convert a Hub dataset repo (see :func:`rlds_cli.sources.download`)."""
    where = parse_hf_url(source)
    sha, files = _listing(where, cache, offline)
    folder = _folder(cache, where, sha)
    fmt = format or layout_format(where, files)
    wanted = needed_files(where, files, fmt, options)
    needed = len(wanted)
    with in_use(folder):  # rlds gc --raw leaves the folder alone until it is converted
        results: list[FetchResult] = []
        if fmt is not None and (options or {}).get("episodes") is not None:
            results, wanted = _episodes_only(where, sha, wanted, folder, fmt, options or {}, force, offline)
        results += fetch_hub_files(
            where, sha, wanted, folder, force=force, offline=offline, progress=progress
        )
        paths = [r.path for r in results]
        if fmt is None and not paths:
            raise SourceFormatError(
                f"{where} holds no data files (only the Hub's dataset card and .gitattributes, if any)",
                hint="check the repo id, the revision and the folder in the URL",
            )
        try:
            fmt = fmt or detect_format(folder if len(paths) != 1 else paths[0])
        except UnknownFormatError as exc:  # it named the download folder: name the repo
            shown = ", ".join(sorted(f.path for f in files)[:5]) + (", ..." if len(files) > 5 else "")
            raise UnknownFormatError(
                f"cannot tell the format of {where} (its files: {shown})", hint=exc.hint
            ) from None
        src: Path | list[Path] = paths[0] if len(paths) == 1 else paths if paths else folder
        if fmt in _HUB_FOLDER_FORMATS:
            src = folder / dataset_folder(where, files, fmt)
        hub: dict[str, Any] = {
            "repo": where.repo,
            "path": where.path,
            "revision": where.revision,
            "commit": sha,
        }
        if len(results) < needed:  # the files holding the episodes asked for, of those of the whole dataset
            hub["subset"] = {"files": len(results), "of": needed}
        result = convert(
            src,
            name or default_name(where),
            format=fmt,
            options=options,
            source_info=provenance(results, folder, url=str(replace(where, revision=sha)), hub=hub),
            **convert_args,
        )
        HashStore(folder).pin(r.name for r in results)
        if not keep_raw:
            drop_raw_files(folder, results)
        return result


def _episodes_only(
    where: HubPath,
    sha: str,
    files: list[HubFile],
    folder: Path,
    fmt: str,
    options: dict[str, Any],
    force: bool,
    offline: bool,
) -> tuple[list[FetchResult], list[HubFile]]:
    """For ``--episodes``: the reader's metadata, fetched first, and the files still to fetch:
    those that hold the selected episodes, as the reader reads them from that metadata (every
    file of ``files`` when the format cannot tell). A file holding other episodes too (a LeRobot
    v3.0 file) is fetched whole.

    Raises:
        InvalidSelectionError: The range selects none of the repo's episodes (only the metadata
            was fetched).
        SourceFormatError: The metadata names a file the repo does not hold.
    """
    by_name = {local_name(where, f): f for f in files}
    meta = reader_class(fmt).plan_files(sorted(by_name))
    if meta is None:
        return [], files
    results = fetch_hub_files(where, sha, [by_name[n] for n in meta], folder, force=force, offline=offline)
    held = episode_files(folder, fmt, options)
    if held is None:
        return results, [f for n, f in by_name.items() if n not in set(meta)]
    missing = [n for n in held if n not in by_name]
    if missing:
        raise SourceFormatError(
            f"{where}: its metadata names {missing[0]!r} for the selected episodes, a file the repo "
            "does not hold",
            hint="the repo is incomplete at that revision; try another revision or the whole repo",
        )
    return results, [by_name[n] for n in held if n not in set(meta)]


def _folder(cache: CacheRoot, where: HubPath, sha: str) -> Path:
    """One download folder per repo, path and commit: files of another commit never mix in."""
    return url_dir(cache, str(replace(where, revision=sha)))


def _listing(where: HubPath, cache: CacheRoot, offline: bool) -> tuple[str, list[HubFile]]:
    """The commit sha and files of ``where``: from the Hub (and kept), or offline from the
    listing kept by an earlier download of that sha."""
    if offline:
        stored = meta_dir(_folder(cache, where, where.revision)) / _LISTING
        if not _SHA.match(where.revision) or not stored.is_file():
            raise OfflineError(
                f"{where} must be resolved on the Hub and offline mode is on",
                hint="download it online once; offline, name the commit: hf://datasets/ORG/REPO@<sha>",
            )
        return where.revision, _stored_files(stored)
    sha, files = resolve(where)
    path = meta_dir(_folder(cache, where, sha)) / _LISTING
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"sha": sha, "files": [f.__dict__ for f in files]}, indent=1) + "\n")
    return sha, files


def _stored_files(stored: Path) -> list[HubFile]:
    """The files of the listing a download kept, checked by the rules applied to the Hub's answer.

    Raises:
        OfflineError: The listing is damaged or names a file rlds may not fetch.
    """
    try:
        entries = json.loads(stored.read_text(encoding="utf-8"))["files"]
        files = [hub_file(e["path"], e["size"], e.get("sha256"), e.get("git_oid")) for e in entries]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        files, why = [], f"{type(exc).__name__}"
    else:
        why = "" if files and None not in files else "it lists no file rlds may fetch"
    if why:
        raise OfflineError(
            f"{stored}: the listing kept by an earlier download is damaged ({why})",
            hint="download it online again (without --offline)",
        )
    return [f for f in files if f is not None]


#: Suffixes of archives and compressed files, all stripped from a default name (x.tar.gz -> x).
_ARCHIVE_SUFFIXES = (".tar", ".tgz", ".tbz2", ".tbz", ".txz", ".zip", ".gz", ".bz2", ".xz", ".zst")


#: Data suffixes also stripped once an archive suffix went (hopper.hdf5.zip -> hopper).
_DATA_SUFFIXES = (".hdf5", ".h5", ".npz", ".npy", ".traj")


#: A version folder's name (a TFDS dataset's ``name/1.0.0``).
_VERSION = re.compile(r"^v?\d+(\.\d+)*$")


def provenance(results: list[FetchResult], folder: Path, **source: Any) -> dict[str, Any]:
    """The ``source`` record of a downloaded dataset: ``source`` (the registry id; a Hub repo's
    ``hf://`` URL at its commit and its ``hub`` record), then ``url`` (``source``'s, else the
    first file's), ``raw_dir`` (the download folder) and ``downloads``: each fetched file's
    ``name``, ``url``, ``sha256``, ``size`` and ``hash_origin``, in the order fetched."""
    return {
        **source,
        "url": source["url"] if "url" in source else results[0].url,
        "raw_dir": str(folder),
        "downloads": [
            {"name": r.name, "url": r.url, "sha256": r.sha256, "size": r.size, "hash_origin": r.hash_origin}
            for r in results
        ],
    }


def default_name(source: Path | HubPath) -> str:
    """The cache name of a download given no name, always a valid one.

    A file: its name without its archive suffixes and data suffix (``x.tar.gz`` -> ``x``,
    ``d.hdf5.zip`` -> ``d``, ``a-v2.1.hdf5`` -> ``a-v2.1``); a folder: its name; a Minari dataset:
    its ``dataset_id``, namespace included (``pendulum/random-v0``). A Hub repo: the last part of
    its path (else the repo's name), a version folder with its parent (``name/1.0.0`` ->
    ``name-1.0.0``). Characters a name cannot hold become ``-``; ``dataset`` when none is left.
    """
    if isinstance(source, HubPath):
        parts = [p for p in source.path.split("/") if p] or [source.repo.split("/")[1]]
        stem = f"{parts[-2]}-{parts[-1]}" if _VERSION.match(parts[-1]) and len(parts) > 1 else parts[-1]
    else:
        from rlds_cli.formats.minari.layout import default_name as minari_name

        named = minari_name(source)
        if named is not None:
            return named
        stem = source.name if source.exists() and not source.is_file() else _strip_suffixes(source.name)
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", stem)
    cleaned = re.sub(r"^[^A-Za-z0-9]+", "", cleaned).rstrip("-.") or "dataset"  # a part starts alphanumeric
    return re.sub(r"-{2,}", "-", cleaned)


def _strip_suffixes(file_name: str) -> str:
    """A file name without all its archive suffixes and then its data suffix; with no archive
    suffix, without its last suffix."""
    name, stripped = file_name, False
    while (suffix := Path(name).suffix.lower()) in _ARCHIVE_SUFFIXES and Path(name).stem:
        name, stripped = name[: -len(suffix)], True
    if not stripped:
        return Path(name).stem if Path(name).suffix else name
    suffix = Path(name).suffix.lower()
    return name[: -len(suffix)] if suffix in _DATA_SUFFIXES and Path(name).stem else name
