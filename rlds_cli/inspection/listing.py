"""What is there: the datasets in the cache and the entries of the registry, as typed records.

``rlds list``, ``rlds list --remote`` and ``rlds info`` render these; ``--json`` prints their
``to_dict()``. A script gets the same facts without the CLI::

    import rlds_cli
    for ds in rlds_cli.list_datasets("hopper*"):
        print(ds.name, ds.num_steps, ds.size_bytes)

Nothing here touches the network: registry entries are reported with what this machine has of
them (downloaded files, a converted dataset).

For a registry entry: what is known and what is on disk (:func:`entry_status`); re-checking a
dataset's files is :mod:`rlds_cli.sources.verify`."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlds_cli.cache.root import CacheRoot
    from rlds_cli.catalog.registry import RegistryEntry


__all__ = ["CachedDataset", "RegistryDataset", "list_datasets", "list_registry", "registry_status"]


Root = str | os.PathLike[str] | None


@dataclass(frozen=True)
class CachedDataset:
    """One dataset in the cache, as ``rlds list`` shows it."""

    name: str
    num_steps: int
    num_episodes: int
    #: Disk use of its directory (allocated blocks, as ``du`` counts;
    #: :meth:`rlds_cli.Dataset.size_bytes`).
    size_bytes: int
    #: Storage: ``memmap`` or ``zarr``.
    backend: str
    #: Where it came from, in a few words: registry id, file, or a view's parent and range.
    source: str
    #: Source format (``d4rl``, ``minari``, ``view``, ``rlds-preprocess``, ...).
    format: str
    #: Names of the datasets it was derived from (views, preprocessed outputs).
    derived_from: list[str | None]
    created_at: str
    #: Why it cannot be read (a growing dataset's damaged commit log or segment), ``None`` when
    #: it can; its counts are then its manifest's.
    damaged: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the rows of ``rlds list --json``)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RegistryDataset:
    """One registry entry with what this machine has of it, as ``rlds list --remote`` and
    ``rlds info`` show it. Counts come from the cached dataset (exact), else the registry
    (exact); ``approx_*`` are the figures an upstream publishes, rounded as published."""

    id: str
    aliases: list[str]
    #: The name ``rlds download`` gives the converted dataset in the cache.
    cache_name: str
    format: str
    description: str
    license: str | None
    #: Reader hints from the registry.
    options: dict[str, Any]
    #: The Hugging Face folder the files are listed from at download time, if any.
    listing: dict[str, Any] | None
    #: Each file: name, urls, size, sha256, sha256_origin, downloaded.
    files: list[dict[str, Any]]
    #: Total download size; None when some file's size is not known yet.
    size_bytes: int | None
    num_steps: int | None
    num_episodes: int | None
    #: Every file is in the raw download folder.
    downloaded: bool
    #: The converted dataset is in the cache.
    cached: bool
    raw_dir: str | None
    #: The registry file that defines the entry.
    registry_file: str
    extra: dict[str, Any]
    #: Where ``num_steps`` comes from: ``cache``, ``registry`` or None (not known).
    num_steps_origin: str | None
    #: The upstream's published figures (with their source), if the registry records them.
    published: dict[str, Any] | None
    approx_num_steps: int | None
    approx_size_bytes: int | None
    #: The Hugging Face Hub dataset repo the files come from (``None``: not from the Hub).
    hub_repo: str | None = None
    #: Its folder as ``rlds download`` takes it: ``hf://datasets/ORG/REPO/PATH``.
    hub_url: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``rlds info --json``, the rows of ``rlds list --remote --json``)."""
        return dataclasses.asdict(self)


def _cache(root: Root | CacheRoot) -> CacheRoot:
    from rlds_cli.cache.root import CacheRoot

    return root if isinstance(root, CacheRoot) else CacheRoot(root)


def list_datasets(pattern: str | None = None, root: Root | CacheRoot = None) -> list[CachedDataset]:
    """The datasets in the cache, sorted by name.

    Args:
        pattern: Keep only names that contain it, or match it as a glob when it holds ``*``,
            ``?`` or ``[`` (ignoring case).
        root: Cache root (a path or a :class:`~rlds_cli.cache.root.CacheRoot`; default: the
            configured one).
    """
    from rlds_cli._util.io import tree_bytes
    from rlds_cli.catalog.registry import matches

    cache = _cache(root)
    return [
        CachedDataset(
            name=m.name,
            num_steps=counts[0],
            num_episodes=counts[1],
            damaged=counts[2],
            size_bytes=tree_bytes(cache.dataset_dir(m.name)),
            backend=m.backend,
            source=_source_label(m.source),
            format=m.source.get("format", ""),
            derived_from=[p.get("name") for p in m.lineage],
            created_at=m.created_at,
        )
        for m in cache.iter_manifests()
        if pattern is None or matches(pattern, m.name)
        for counts in (_counts(cache, m),)
    ]


def _counts(cache: CacheRoot, m: Any) -> tuple[int, int, str | None]:
    """Steps and episodes of a dataset (a growing one's from its current view, its head manifest
    holding none), and why it cannot be read (``None``: it can)."""
    from rlds_cli.cache.layout import SEGMENTED_LAYOUT

    if m.layout != SEGMENTED_LAYOUT:
        return m.num_steps, m.num_episodes, None
    from rlds_cli.cache.growing import GrowingDataset
    from rlds_cli.cache.log_checkpoint import verify_log
    from rlds_cli.errors import CacheError, DatasetReplacedError

    try:
        # the whole log, not only what a reader replays from its checkpoint: damage anywhere
        # marks the row (0.3 s at 100,000 commits)
        verify_log(cache.dataset_dir(m.name))
        ds = GrowingDataset(cache.dataset_dir(m.name), m)
    except DatasetReplacedError:  # its segments removed faster than a view is made: no damage
        return m.num_steps, m.num_episodes, None
    except CacheError as exc:  # damaged
        return m.num_steps, m.num_episodes, exc.message
    return ds.num_steps, ds.num_episodes, None


def _source_label(source: dict[str, Any]) -> str:
    """Where a dataset came from, in a few words: registry id, file, or a view's parent range."""
    if source.get("format") == "view":
        a, b = source.get("episodes") or ("", "")
        if "episode_ids" in source:  # a selection (e.g. a random split): a count, not a range
            return f"{source.get('parent', '')} {len(source['episode_ids'])} episodes (a selection)"
        return f"{source.get('parent', '')} episodes {a}:{b}"
    if source.get("format") == "rlds-writer":
        return "growing (DatasetWriter)"
    if source.get("format") == "composed":  # merge, trim, drop of a merged one: its parents
        parents = list(dict.fromkeys(str(p.get("parent", "")) for p in source.get("parts", [])))
        return f"{source.get('op', 'composed')} of {', '.join(parents)}"
    if source.get("format") == "rlds-downsample":
        return f"one step in {source.get('every')} of {source.get('parent', '')}"
    return str(source.get("id") or source.get("path", ""))


def list_registry(pattern: str | None = None, root: Root | CacheRoot = None) -> list[RegistryDataset]:
    """The registry's entries (those whose id, an alias or the description matches ``pattern``,
    as :func:`list_datasets` matches names, or whose Hugging Face Hub repo or folder it names:
    ``farama-minari/D4RL``), sorted by id, each with its local state."""
    from rlds_cli.catalog import registry
    from rlds_cli.catalog.registry import matches_repo

    cache = _cache(root)
    found = registry.entries() if pattern is None else registry.search(pattern)
    if pattern is not None:
        ids = {e.id for e in found}
        found = [*found, *(e for e in registry.entries() if e.id not in ids and matches_repo(pattern, e))]
    return [_status(entry, cache) for entry in found]


def registry_status(dataset_id: str, root: Root | CacheRoot = None) -> RegistryDataset:
    """One registry entry, by id or alias, with its local state.

    Raises:
        UnknownDatasetIdError: The registry does not know ``dataset_id``; the hint names close ids.
    """
    from rlds_cli.catalog import registry

    return _status(registry.resolve(dataset_id), _cache(root))


def _status(entry: RegistryEntry, cache: CacheRoot) -> RegistryDataset:
    row = entry_status(entry, cache)
    origin = "registry" if row["num_steps"] else None
    if row["cached"]:
        manifest = cache.manifest(entry.cache_name)
        row["num_steps"], row["num_episodes"], origin = manifest.num_steps, manifest.num_episodes, "cache"
    from rlds_cli.catalog.registry import hub_source

    hub = hub_source(entry)
    published = entry.published
    if row["num_episodes"] is None and published and published.episodes:
        row["num_episodes"] = published.episodes
    return RegistryDataset(
        **row,
        num_steps_origin=origin,
        published=published.to_dict() if published else None,
        approx_num_steps=published.steps if published else None,
        approx_size_bytes=published.size_bytes if published else None,
        hub_repo=hub.repo if hub else None,
        hub_url=hub.url if hub else None,
    )


def holds_entry(cache: CacheRoot, entry: RegistryEntry) -> bool:
    """Whether the cache holds ``entry`` converted: a dataset under its cache name whose manifest
    says it was downloaded as that entry (a view or a dataset of one's own may have that name)."""
    from rlds_cli.errors import CorruptDatasetError

    if not cache.exists(entry.cache_name):
        return False
    try:
        return cache.manifest(entry.cache_name).source.get("id") == entry.id
    except CorruptDatasetError:
        return False


def entry_status(entry: RegistryEntry, cache: CacheRoot) -> dict[str, Any]:
    """A registry entry with what this machine has of it (never touches the network).

    Returns:
        A JSON-ready dict: the entry's fields, its files (with size, sha256 and where the hash
        comes from), ``downloaded`` (every file present), ``cached`` (converted) and
        ``size_bytes`` (total download size, ``None`` when some size is unknown).
    """
    # imported here: listing the cache alone loads nothing of the registry or the network
    from rlds_cli.net.hub import HubPath, read_listing
    from rlds_cli.net.layout import HashStore, raw_dir

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
        "cached": holds_entry(cache, entry),
        "raw_dir": None if entry.is_bundled else str(folder),
        "registry_file": entry.origin,
        "extra": entry.extra,
    }
