"""What is known and what is on disk for a registry entry (``rlds info``, ``rlds list --remote``),
and re-checking downloaded files against their hashes (``rlds verify``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlds_cli import registry
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import DatasetNotFoundError
from rlds_cli.net.fetch import sha256_of
from rlds_cli.net.hashes import HashStore
from rlds_cli.net.layout import raw_dir, stored_listing


def entry_status(entry: registry.RegistryEntry, cache: CacheRoot) -> dict[str, Any]:
    """A registry entry with what this machine has of it (never touches the network).

    Returns:
        A JSON-ready dict: the entry's fields, its files (with size, sha256 and where the hash
        comes from), ``downloaded`` (every file present), ``cached`` (converted) and
        ``size_bytes`` (total download size, ``None`` when some size is unknown).
    """
    folder = raw_dir(cache, entry.cache_name)
    records = HashStore(folder).read() if not entry.is_bundled else {}
    files = [{"name": f.name, "urls": list(f.urls), "size": f.size, "sha256": f.sha256} for f in entry.files]
    known = stored_listing(folder) if entry.listing is not None else None
    if known is not None:
        listed = json.loads(known.read_text(encoding="utf-8"))
        files += [{k: f[k] for k in ("name", "urls", "size", "sha256")} for f in listed]
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


def verify(name: str, root: str | Path | CacheRoot | None = None) -> dict[str, Any]:
    """Re-hash the downloaded files of a dataset and check them and its manifest.

    Args:
        name: A dataset name in the cache, or a registry id or alias.
        root: Cache root.

    Returns:
        A JSON-ready dict with ``files`` (each ``ok``, ``mismatch`` or ``not kept``),
        ``manifest`` checks, and ``ok`` (``False`` when anything mismatched).

    Raises:
        DatasetNotFoundError: Neither a cached dataset nor downloaded files of that name.
    """
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    entry = registry.resolve(name) if not cache.exists(name) and registry.is_known(name) else None
    cache_name = entry.cache_name if entry else name
    manifest = cache.manifest(cache_name) if cache.exists(cache_name) else None
    folder = _raw_folder(cache, name, entry, manifest)
    if manifest is None and (folder is None or not HashStore(folder).exists()):
        raise DatasetNotFoundError(
            f"nothing to verify for {name!r}: no dataset of that name in the cache at {cache.path} "
            "and no downloaded files"
        )
    known = {f.name: f.sha256 for f in entry.files if f.sha256} if entry else {}
    files = _check_files(folder, known) if folder is not None else []
    checks = _check_manifest(manifest, {f["name"]: f for f in files}) if manifest else []
    if manifest is not None:
        checks.append(_check_cache_files(cache, cache_name))
    ok = all(f["status"] != "mismatch" for f in files) and all(c["ok"] for c in checks)
    return {
        "name": cache_name,
        "raw_dir": str(folder) if folder else None,
        "files": files,
        "manifest": checks,
        "ok": ok,
    }


def _check_cache_files(cache: CacheRoot, name: str) -> dict[str, Any]:
    """Every file of the cached dataset is there at its full size (no data is read)."""
    from rlds_cli.cache.dataset import open_dataset

    problems = open_dataset(name, cache).check_files()
    return {
        "check": "cache files complete",
        "ok": not problems,
        "actual": "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""),
        "expected": "every array file and chunk",
    }


def _raw_folder(
    cache: CacheRoot, name: str, entry: registry.RegistryEntry | None, manifest: Any
) -> Path | None:
    if manifest is not None and manifest.source.get("raw_dir"):
        return Path(manifest.source["raw_dir"])
    if entry is None and registry.is_known(name):
        entry = registry.resolve(name)
    return raw_dir(cache, entry.cache_name) if entry is not None and not entry.is_bundled else None


def _check_files(folder: Path, known: dict[str, str]) -> list[dict[str, Any]]:
    records = HashStore(folder).read()
    out = []
    for file_name in sorted(set(records) | set(known)):
        rec = records.get(file_name)
        expected = known.get(file_name) or (rec.sha256 if rec else None)
        path = folder / file_name
        row: dict[str, Any] = {"name": file_name, "expected": expected, "actual": None}
        row["origin"] = "registry" if file_name in known else (rec.origin if rec else None)
        if not path.is_file():
            row["status"] = "not kept"
        else:
            row["actual"] = sha256_of(path)
            clash = rec is not None and file_name in known and rec.sha256 != known[file_name]
            row["status"] = "ok" if row["actual"] == expected and not clash else "mismatch"
        out.append(row)
    return out


def _check_manifest(manifest: Any, files: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifest's record of its source against the raw files (or their recorded hashes)."""
    source = manifest.source
    checks = []
    downloads = source.get("downloads", [])
    for d in downloads:
        f = files.get(d["name"])
        now = (f["actual"] or f["expected"]) if f else None
        checks.append(
            {
                "check": f"source file {d['name']}",
                "expected": d["sha256"],
                "actual": now,
                "ok": now is None or now == d["sha256"],
            }
        )
    if len(downloads) == 1:
        checks.append(
            {
                "check": "manifest source sha256",
                "expected": source.get("sha256"),
                "actual": downloads[0]["sha256"],
                "ok": source.get("sha256") == downloads[0]["sha256"],
            }
        )
    elif not downloads and source.get("path") and Path(source["path"]).is_file():
        actual = sha256_of(Path(source["path"]))
        checks.append(
            {
                "check": f"source file {source['path']}",
                "expected": source.get("sha256"),
                "actual": actual,
                "ok": actual == source.get("sha256"),
            }
        )
    return checks
