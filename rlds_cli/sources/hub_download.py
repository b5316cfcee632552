"""``rlds download hf://datasets/ORG/REPO[/PATH][@REVISION]``: a Hub dataset repo into the cache.

The revision is resolved to a commit sha first, and everything after that is read at that sha
(a branch moving mid-download cannot mix two versions); the sha is recorded in the dataset's
provenance. Files land in a download folder of their own per repo, path and commit
(``<root>/raw/urls/...``), verified (:mod:`rlds_cli.net.hub.fetch`), then converted.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlds_cli._util.io import atomic_write
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import OfflineError, SourceFormatError
from rlds_cli.formats import detect_format, reader_class
from rlds_cli.net.fetch import FetchResult, drop_raw_files
from rlds_cli.net.hashes import HashStore
from rlds_cli.net.hub.fetch import fetch_hub_files, local_name
from rlds_cli.net.hub.plan import dataset_folder, layout_format, needed_files
from rlds_cli.net.hub.repo import HubFile, HubPath, hub_file, parse_hf_url, resolve
from rlds_cli.net.layout import meta_dir, url_dir
from rlds_cli.sources.convert import ConvertResult, convert, episode_files
from rlds_cli.sources.provenance import default_name, provenance

#: Formats whose reader takes the dataset's folder rather than its files (an RLDS reader reads
#: one TFDS folder: ``features.json``, ``dataset_info.json`` and the shards of one split).
_FOLDER_FORMATS = {"minari", "lerobot", "rlds"}
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
) -> ConvertResult:
    """Resolve, fetch, verify and convert a Hub dataset repo (see :func:`rlds_cli.sources.download`)."""
    where = parse_hf_url(source)
    sha, files = _listing(where, cache, offline)
    folder = _folder(cache, where, sha)
    fmt = format or layout_format(where, files)
    wanted = needed_files(where, files, fmt, options)
    needed = len(wanted)
    results: list[FetchResult] = []
    if fmt is not None and (options or {}).get("episodes") is not None:
        results, wanted = _episodes_only(where, sha, wanted, folder, fmt, options or {}, force, offline)
    results += fetch_hub_files(where, sha, wanted, folder, force=force, offline=offline)
    paths = [r.path for r in results]
    fmt = fmt or detect_format(folder if len(paths) != 1 else paths[0])
    src: Path | list[Path] = paths[0] if len(paths) == 1 else paths if paths else folder
    if fmt in _FOLDER_FORMATS:
        src = folder / dataset_folder(where, files, fmt)
    hub: dict[str, Any] = {"repo": where.repo, "path": where.path, "revision": where.revision, "commit": sha}
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
