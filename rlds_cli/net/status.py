"""What is known and what is on disk for a registry entry (``rlds info``, ``rlds list --remote``);
re-checking a dataset's files is :mod:`rlds_cli.sources.verify`."""

from __future__ import annotations

from typing import Any

from rlds_cli.cache.root import CacheRoot
from rlds_cli.catalog import registry
from rlds_cli.net.hashes import HashStore
from rlds_cli.net.hub.folder import read_listing
from rlds_cli.net.hub.repo import HubPath
from rlds_cli.net.layout import raw_dir


def entry_status(entry: registry.RegistryEntry, cache: CacheRoot) -> dict[str, Any]:
    """A registry entry with what this machine has of it (never touches the network).

    Returns:
        A JSON-ready dict: the entry's fields, its files (with size, sha256 and where the hash
        comes from), ``downloaded`` (every file present), ``cached`` (converted) and
        ``size_bytes`` (total download size, ``None`` when some size is unknown).
    """
    folder = raw_dir(cache, entry.cache_name)
    records = HashStore(folder).read() if not entry.is_bundled else {}
    files: list[dict[str, Any]] = [
        {"name": f.name, "urls": list(f.urls), "size": f.size, "sha256": f.sha256} for f in entry.files
    ]
    lst = entry.listing
    known = read_listing(folder, HubPath(lst.hf_repo, lst.path, lst.revision)) if lst is not None else None
    if known is not None:
        files += [
            {"name": f.name, "urls": list(f.urls), "size": f.size, "sha256": f.sha256} for f in known.files
        ]
    for f in files:
        rec = records.get(f["name"])
        # a hash seen on a download that has not converted yet binds nothing: say so
        seen = "recorded" if rec is not None and rec.pinned else "unconfirmed"
        f["sha256_origin"] = "registry" if f["sha256"] else (seen if rec else None)
        f["sha256"] = f["sha256"] or (rec.sha256 if rec else None)
        f["size"] = f["size"] if f["size"] is not None else (rec.size if rec else None)
        f["downloaded"] = entry.is_bundled or (folder / f["name"]).is_file()
    sizes = [f["size"] for f in files]
    listing_known = entry.listing is None or known is not None
    return {
        "id": entry.id,
        "aliases": list(entry.aliases),
        "cache_name": entry.cache_name,
        "format": entry.format,
        "description": entry.description,
        "license": entry.license,
        "options": entry.options,
        "listing": None if entry.listing is None else vars(entry.listing),
        "files": files,
        "size_bytes": sum(sizes) if listing_known and None not in sizes else None,
        "num_steps": entry.extra.get("num_steps", entry.extra.get("source_rows")),
        "num_episodes": entry.extra.get("num_episodes"),
        "downloaded": listing_known and all(f["downloaded"] for f in files),
        "cached": cache.exists(entry.cache_name),
        "raw_dir": None if entry.is_bundled else str(folder),
        "registry_file": entry.origin,
        "extra": entry.extra,
    }
