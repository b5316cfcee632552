"""Every path and file name of the cache, in one place.

Layout under the root::

    datasets/<entry>/                   published datasets (one directory each)
        manifest.json                   written last: a directory without it is no dataset
        episodes.npy                    the episode index (see :mod:`rlds_cli.cache.episodes`)
        source_metadata.npz             the source's non-step arrays (optional)
        arrays/                         the columns (one ``<key>.npy`` each, or a zarr group)
    commits.log, segments/<id>/, building/   a growing dataset (``layout: "segmented"``)
    tmp/<entry>.<id>.incomplete         builds in progress (never read by anyone)
    tmp/<entry>.<id>.trash              a replaced dataset on its way out
    tmp/<entry>.<id>.publish            the journal of a replacement in progress
    tmp/<entry>.job-<id>/               a preprocess job: job.json, out/ (the output), chunks/
    tmp/.push-<id>.journal              what a push to one URL has uploaded so far
    locks/<entry>.lock                  one lock file per dataset name
    locks/.push-<id>.lock, locks/.preprocess-<id>.lock   pushes and jobs to a URL
    raw/<entry>/, raw/url-<hash>/       download folders, their bookkeeping in ``.rlds/``

``<entry>`` is the dataset name with ``/`` written as ``--`` (``D4RL/door/human-v2`` ->
``D4RL--door--human-v2``, as in the Hugging Face cache), so ``--`` is not allowed in a name.

This module only names paths: it creates, reads and removes nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from rlds_cli.errors import InvalidNameError

DATASETS_DIR = "datasets"
TMP_DIR = "tmp"
LOCKS_DIR = "locks"
RAW_DIR = "raw"

# ---- inside a dataset directory
MANIFEST_FILE = "manifest.json"
EPISODES_FILE = "episodes.npy"
SOURCE_ARRAYS_FILE = "source_metadata.npz"
#: Source arrays with one row per episode (``<format>/episode_<what>``).
EPISODE_ARRAY = re.compile(r"(?:^|/)episode_[^/]+$")

ARRAYS_DIR = "arrays"
#: The manifest's ``layout`` of a view (its columns are its parent's).
VIEW_LAYOUT = "view"
#: The manifest's ``layout`` of a composed dataset (its columns are its parents', end to end).
COMPOSED_LAYOUT = "composed"

# ---- inside a growing dataset (layout "segmented"; see cache/commit_log.py)
SEGMENTED_LAYOUT = "segmented"
SEGMENTS_DIR = "segments"
COMMIT_LOG_FILE = "commits.log"
#: Under segments/: the commit log's checkpoint (cache/log_checkpoint.py). No segment's name
#: starts with a dot.
LOG_CHECKPOINT_FILE = ".log-state"
#: Segment builds in progress (inside the dataset: a rename away from segments/).
SEGMENT_BUILDS_DIR = "building"
#: Inside a segment's folder, made empty with it: where its writer marks the segment recorded.
#: Its own folder, so the mark changes no folder a reader pins (a segment's ctime is its version).
COMMIT_MARK_DIR = "commit"
#: The empty file a segment's writer makes once its record is in the log (cache/commit_log.py,
#: "segments it does not name"): the only file added after a segment's rename.
COMMITTED_FILE = f"{COMMIT_MARK_DIR}/recorded"
#: The folders a growing dataset has from the start, empty or not (a copy made by pull too): a
#: writer adding one would change the dataset folder's ctime, the version its readers pin.
GROWING_FOLDERS = (SEGMENTS_DIR, SEGMENT_BUILDS_DIR)
#: Added to a growing dataset's entry: the compaction lock in locks/ (one compaction at a time;
#: a writer takes it without waiting to merge its small segments).
COMPACT_LOCK_SUFFIX = ".compact"
#: Added to a growing dataset's entry: held by a compaction waiting for its lock (writers merge
#: nothing while it is held).
COMPACT_WANTED_SUFFIX = ".compact-wanted"

# ---- under tmp/
BUILD_SUFFIX = ".incomplete"
TRASH_SUFFIX = ".trash"
JOURNAL_SUFFIX = ".publish"
#: What separates the output's entry from the job id in a preprocess job directory's name.
JOB_MARK = ".job-"
#: What separates the dataset's entry from the export's id in a Hub export's build name and lock.
HUB_EXPORT_MARK = "~hub-export-"
#: A preprocess job's id: this many hex digits (of a sha256 of what makes its output).
JOB_ID_DIGITS = 16
#: A job directory's name: the entry, the mark, the job id. A build of an entry whose name holds
#: the mark (``a.job-b.<id>.incomplete``) is not one.
_JOB_DIR = re.compile(rf"(?P<entry>.+){re.escape(JOB_MARK)}[0-9a-f]{{{JOB_ID_DIGITS}}}")
JOB_FILE = "job.json"
JOB_OUTPUT_DIR = "out"
JOB_CHUNKS_DIR = "chunks"
LOCK_SUFFIX = ".lock"
PUSH_JOURNAL_SUFFIX = ".journal"

# ---- a download folder (raw/<entry>/): every name but META_DIR belongs to the downloaded files
#: The download folder's entry for rlds' own bookkeeping (hashes, file list, locks, partial
#: downloads), kept apart from the downloaded files' names.
META_DIR = ".rlds"
PART_SUFFIX = ".part"
HASHES_FILE = "hashes.json"
LISTING_FILE = "listing.json"
#: Under META_DIR: partial downloads, and the lock each file's download holds while it runs.
PARTS_DIR = "parts"
DOWNLOAD_LOCKS_DIR = "locks"

_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_NAME_RE = re.compile(rf"^{_PART}(/{_PART})*$")
#: Bytes of a directory entry name on common filesystems; a build directory's name adds a
#: 12-character id and a suffix to the entry, so entries are kept well under it.
_MAX_ENTRY_BYTES = 200


#: A URL's scheme (``s3://``, ``file:///``, ``memory://``): what tells a URL from a dataset name.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(name: str | os.PathLike[str]) -> bool:
    """Whether ``name`` is a URL (``s3://...``, ``file:///...``, ``memory://...``), not a name."""
    return isinstance(name, str) and bool(_URL.match(name))


def validate_name(name: str) -> str:
    """Return ``name`` if it can name a cache entry, else raise :class:`InvalidNameError`."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or "--" in name:
        raise InvalidNameError(f"invalid dataset name {name!r}", hint=_name_hint(name))
    if len(name.replace("/", "--").encode()) > _MAX_ENTRY_BYTES:
        raise InvalidNameError(
            f"dataset name {name[:40]!r}... is {len(name)} characters long",
            hint=f"use a name of at most {_MAX_ENTRY_BYTES} bytes (each '/' counts as two)",
        )
    return name


def _name_hint(name: object) -> str | None:
    """What to do with a URL or a path given where a dataset name goes (``None``: the rule)."""
    if isinstance(name, str) and is_url(name):
        return (
            "a URL is no name of the cache: 'rlds pull URL --name NAME' copies it in ('rlds inspect "
            "URL', 'rlds show URL' and rlds_cli.open_dataset(URL) read it where it lies)"
        )
    if isinstance(name, str) and (name.startswith(("/", "./", "../", "~")) or os.path.exists(name)):
        return (
            "a path is no name of the cache: 'rlds download PATH' converts a file into it; a "
            f"dataset pushed to a folder is read as file://{os.path.abspath(os.path.expanduser(name))}"
        )
    return None


def entry_name(name: str) -> str:
    """The directory entry of a dataset name (``a/b`` -> ``a--b``), after checking the name."""
    return validate_name(name).replace("/", "--")


def new_id() -> str:
    """A fresh id for a temporary entry (12 hex digits)."""
    return uuid.uuid4().hex[:12]


def tmp_owner(path: Path) -> str:
    """The entry a ``tmp/`` item belongs to: ``<entry>.<id>.<suffix>``, ``<entry>.job-<id>``, or
    a journal's temp file ``.<entry>.<id>.publish.tmp`` (entries may hold dots; ids cannot)."""
    name = path.name
    job = _JOB_DIR.fullmatch(name)
    if job is not None:
        return job["entry"]
    return name.lstrip(".").removesuffix(".tmp").rsplit(".", 2)[0]


def download_locks(folder: Path) -> list[Path]:
    """The lock files of a download folder (``.rlds/locks/<file>.lock``), each held while that
    file downloads."""
    return list(folder.glob(f"{META_DIR}/{DOWNLOAD_LOCKS_DIR}/**/*{LOCK_SUFFIX}"))


def segment_folders(directory: Path) -> list[Path]:
    """Everything in ``directory``'s ``segments/`` except :data:`LOG_CHECKPOINT_FILE`, in name
    order (segments named by the log or not, and strays); empty when absent."""
    segments = directory / SEGMENTS_DIR
    if not segments.is_dir():
        return []
    return sorted(p for p in segments.iterdir() if p.name != LOG_CHECKPOINT_FILE)


@dataclass(frozen=True)
class CacheLayout:
    """Where everything lies under one cache root (see the module docstring)."""

    root: Path

    @property
    def datasets_dir(self) -> Path:
        return self.root / DATASETS_DIR

    @property
    def tmp_dir(self) -> Path:
        return self.root / TMP_DIR

    @property
    def locks_dir(self) -> Path:
        return self.root / LOCKS_DIR

    @property
    def raw_dir(self) -> Path:
        """The folder of every download."""
        return self.root / RAW_DIR

    def dataset_dir(self, name: str) -> Path:
        """The directory a dataset of this name is (or would be) published at."""
        return self.datasets_dir / entry_name(name)

    def lock_file(self, entry: str) -> Path:
        """The lock file of a dataset entry (or of a private lock name like ``.push-<id>``)."""
        return self.locks_dir / f"{entry}{LOCK_SUFFIX}"

    def build_dir(self, entry: str, ident: str | None = None) -> Path:
        """A build directory of ``entry`` (a fresh id unless ``ident`` is given)."""
        return self.tmp_dir / f"{entry}.{ident or new_id()}{BUILD_SUFFIX}"

    def trash_dir(self, entry: str) -> Path:
        """A fresh place for an old version of ``entry`` on its way out."""
        return self.tmp_dir / f"{entry}.{new_id()}{TRASH_SUFFIX}"

    def journal_file(self, entry: str) -> Path:
        """A fresh journal of a replacement of ``entry``."""
        return self.tmp_dir / f"{entry}.{new_id()}{JOURNAL_SUFFIX}"

    def job_dir(self, entry: str, job_id: str) -> Path:
        """The directory of a preprocess job whose output is ``entry``."""
        return self.tmp_dir / f"{entry}{JOB_MARK}{job_id}"

    def push_journal(self, ident: str) -> Path:
        """What a push to one URL (``ident`` hashes it) has uploaded, kept between runs."""
        return self.tmp_dir / f".push-{ident}{PUSH_JOURNAL_SUFFIX}"

    def job_dirs(self) -> list[Path]:
        """Every preprocess job directory, sorted."""
        if not self.tmp_dir.is_dir():
            return []
        return sorted(p for p in self.tmp_dir.glob(f"*{JOB_MARK}*") if _JOB_DIR.fullmatch(p.name))

    def download_dir(self, name: str) -> Path:
        """The download folder of a registry entry (``name`` is its cache name)."""
        return self.raw_dir / entry_name(name)

    def url_download_dir(self, url: str) -> Path:
        """The download folder of an ad-hoc URL: one per URL, so recorded hashes never collide."""
        return self.raw_dir / f"url-{hashlib.sha256(url.encode()).hexdigest()[:16]}"


#: The manifest's ``source.metadata`` entry naming a source's filter keys (robomimic's
#: ``mask/<key>``), in the column order of :data:`MEMBER_ARRAY`.
FILTER_KEYS = "filter_keys"
#: The source array of filter-key membership (bool ``[episodes, keys]``).
MEMBER_ARRAY = "filter_keys/episode_member"


def is_episode_array(name: str) -> bool:
    """Whether a source array holds one row per episode (``<format>/episode_<what>``)."""
    return EPISODE_ARRAY.search(name) is not None


def text_blob_name(array: str) -> str:
    """The blob of UTF-8 texts a per-episode array of byte ranges (``<format>/episode_<what>``)
    indexes: ``<format>/text/<what>``."""
    prefix, _, what = array.rpartition("/")
    what = what.removeprefix("episode_")
    return f"{prefix}/text/{what}" if prefix else f"text/{what}"
