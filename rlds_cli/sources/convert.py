"""Conversion of a local source into the cache: reader -> builder, with provenance.

A source is one file, a directory (a Minari dataset, a folder of Roboset ``.h5`` or AMAGO
``.npz`` files), a list of files, or an archive (``.zip``, ``.tar``, ``.tar.gz``) holding any of
these, which is unpacked safely into a private directory under the cache root first
(:mod:`rlds_cli.formats.archives`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from rlds_cli._util.cpus import usable_cpus
from rlds_cli._util.io import sha256_file
from rlds_cli._util.progress import Progress
from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.card import declared_card, make_card, with_user
from rlds_cli.cache.manifest import Manifest, strict_json
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import (
    ChecksumMismatchError,
    ConversionError,
    DatasetExistsError,
    InvalidSelectionError,
    RldsError,
    SourceError,
    SourceFormatError,
    SourceNotFoundError,
)
from rlds_cli.formats import detect_format, is_archive, reader_class, source_files
from rlds_cli.formats.base import StepBlock, parse_options
from rlds_cli.frames.codecs import FramesMode, block_rows

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class ConvertResult:
    """What :func:`convert` did.

    Attributes:
        manifest: The manifest of the dataset now in the cache.
        reused: ``True`` when the same source was already converted under that name and
            nothing was written.
        path: The dataset's directory.
    """

    manifest: Manifest
    reused: bool
    path: Path


# Progress events (:data:`rlds_cli._util.progress.Progress`): ``"start"`` (total rows),
# ``"advance"`` (rows done), ``"hash"`` (source bytes hashed; sent once the digest is checked,
# before the commit).

#: Options convert() applies itself, between the reader and the builder (formats/select.py).
_SELECTION_OPTIONS = frozenset({"episodes", "keys"})
#: Options that change how a conversion runs, not what it produces (left out of reuse checks).
_RUNTIME_OPTIONS = frozenset({"workers"})

PathLike = str | os.PathLike[str]


def _as_paths(source: PathLike | Sequence[PathLike]) -> list[Path]:
    if isinstance(source, str | os.PathLike):
        paths = [Path(source).expanduser()]
    else:
        paths = [Path(p).expanduser() for p in source]
        if not paths:
            raise SourceNotFoundError("no source files given")
    for p in paths:
        if not p.exists():
            raise SourceNotFoundError(f"source file {p} does not exist")
        if not (p.is_file() or p.is_dir()):  # reading a FIFO or a device would never end
            raise SourceError(
                f"source {p} is not a file or a folder (a pipe, a device or a socket)",
                hint="copy the data into a file, then convert that",
            )
    return paths


def _signature(path: Path) -> tuple[int, int, int]:
    """Size, modification time and inode of ``path`` (what any rewrite of it changes)."""
    try:
        st = path.stat()
    except OSError:  # gone: a signature nothing matches
        return (-1, -1, -1)
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _hash_files(
    files: list[Path], root: Path, known: dict[Path, Future[str]], stop: threading.Event
) -> list[dict[str, Any]]:
    """sha256 and size of every file (threads: hashlib releases the GIL on large reads); a file
    of ``known`` takes the digest already under way there."""
    from concurrent.futures import ThreadPoolExecutor

    def digest(f: Path) -> str:
        return known[f].result() if f in known else sha256_file(f, stop)

    workers = min(len(files), usable_cpus())
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            digests = list(pool.map(digest, files))
    else:
        digests = [digest(f) for f in files]
    out = []
    for f, sha256 in zip(files, digests, strict=True):
        rel = os.path.relpath(f, root) if root != f else f.name
        out.append({"path": Path(rel).as_posix(), "sha256": sha256, "size": f.stat().st_size})
    return out


def _on_thread(work: Callable[[], T]) -> Future[T]:
    """``work()`` run on a daemon thread (an interrupted conversion exits without waiting)."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as exc:  # handed to whoever waits for the result
            future.set_exception(exc)

    threading.Thread(target=run, name="rlds-hash", daemon=True).start()
    return future


def _tree_sha256(files: list[dict[str, Any]]) -> str:
    """One digest for a multi-file source: sha256 over ``path NUL sha256 LF`` per file."""
    digest = hashlib.sha256()
    for entry in files:
        digest.update(f"{entry['path']}\0{entry['sha256']}\n".encode())
    return digest.hexdigest()


def _checked_options(fmt: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the reader's own parsed by its ``Options`` (a CLI string becomes the
    option's type); selection and generic options pass unchanged."""
    reader = {k: v for k, v in options.items() if k not in _SELECTION_OPTIONS}
    return {**options, **parse_options(reader_class(fmt), reader)}


def episode_files(source: Path, fmt: str, options: dict[str, Any]) -> list[str] | None:
    """The files of ``source`` (``/``-separated, relative to it) holding the episodes that
    ``options["episodes"]`` selects, read from the metadata already on disk by the reader of
    ``fmt`` (:meth:`~rlds_cli.formats.base.Reader.episode_files`); ``None`` when no episodes are
    selected or the reader cannot tell (every file is then needed).

    Raises:
        InvalidSelectionError: The range selects none of the source's episodes.
    """
    if options.get("episodes") is None:
        return None
    from rlds_cli.formats.select import parse_episodes

    cls = reader_class(fmt)
    options = _checked_options(fmt, options)
    with cls(source, **{k: v for k, v in options.items() if k in cls.Options.names()}) as reader:
        reader.select_episodes(*parse_episodes(options["episodes"]))
        return reader.episode_files()


def _without_empty_rows(blocks: Iterable[StepBlock], shown: Path, notes: list[str]) -> Iterator[StepBlock]:
    """``blocks`` without the keys whose rows hold no value (a ``(T, 0)`` array), each named once
    in ``notes``: nothing of them is lost, and no column of zero-width rows is stored."""
    dropped: set[str] = set()

    def kept(columns: Mapping[str, Any]) -> dict[str, Any]:
        out = {}
        for key, rows in columns.items():
            shape = tuple(getattr(rows, "shape", ()))  # encoded frames: their decoded shape
            if 0 not in shape[1:]:
                out[key] = rows
                continue
            if key == "action":
                raise SourceFormatError(
                    f"{shown}: the action has rows of shape {shape[1:]}, which hold no value",
                    hint="a step needs an action: check the file, or pass --option action_key=KEY where "
                    "the format has it",
                )
            if key not in dropped:
                dropped.add(key)
                notes.append(f"{key} holds rows of shape {shape[1:]} (no values): not stored")
        return out

    for block in blocks:
        observations = kept(block.observations)
        if block.observations and not observations:
            raise SourceFormatError(
                f"{shown}: no observation holds a value (each has rows of width 0)",
                hint="a step needs an observation: check the file",
            )
        yield replace(block, steps=kept(block.steps), observations=observations)


def _count_nans(block: StepBlock, counts: dict[str, int]) -> None:
    for columns in (block.steps, block.observations):
        for key, rows in columns.items():
            arr = block_rows(rows)  # frames stay encoded (uint8: no NaN to count)
            if isinstance(arr, np.ndarray) and arr.dtype.kind in "fc":
                counts[key] = counts.get(key, 0) + _nans(arr)
            else:
                counts.setdefault(key, 0)


def _nans(arr: np.ndarray) -> int:
    """The number of NaNs in ``arr``; a real array whose ``min()`` (which propagates NaN) is not
    NaN is skipped without allocating ``np.isnan``'s bool array (page faults per block)."""
    if arr.dtype.kind == "f" and (arr.size == 0 or not np.isnan(arr.min())):
        return 0
    return int(np.count_nonzero(np.isnan(arr)))


def _stored_backend(cache: CacheRoot, name: str) -> str:
    """The storage of the dataset already under ``name``, else the default ``memmap``."""
    try:
        return cache.manifest(name).backend
    except (RldsError, OSError):  # none there (or unreadable: the builder says so)
        return "memmap"


def convert(
    source: PathLike | Sequence[PathLike],
    name: str,
    *,
    format: str | None = None,
    root: PathLike | CacheRoot | None = None,
    backend: str | None = None,
    frames: str | FramesMode | None = None,
    force: bool = False,
    options: dict[str, Any] | None = None,
    source_info: dict[str, Any] | None = None,
    expected_sha256: str | None = None,
    expected_origin: str = "user",
    progress: Progress | None = None,
    license: str | None = None,
    citation: str | None = None,
    registry_license: str | None = None,
    env: dict[str, Any] | None = None,
) -> ConvertResult:
    """Convert a local source into a cached TED dataset.

    A dataset of the same name converted from the same bytes with the same options is reused
    untouched (unless ``force``).

    Args:
        source: A file, a directory, a list of files, or an archive of any of them.
        name: Dataset name in the cache.
        format: Source format (``None``: detect from the files).
        root: Cache root.
        backend: ``"memmap"`` or ``"zarr"``; ``None``: the existing dataset's, else ``"memmap"``.
            One that differs from the existing dataset's is refused without ``force``.
        frames: What to do with camera frames (:mod:`rlds_cli.frames.codecs`): ``keep`` (the
            default: frames that arrive encoded keep the source's bytes, arrays stay arrays),
            ``raw``, ``jpeg[:QUALITY]``, ``png`` or ``webp``. A dataset converted from the same
            bytes with another mode is not reused.
        force: Rebuild and replace an existing dataset of this name.
        options: Reader options (e.g. ``{"max_episode_steps": 1000}``, ``{"workers": 4}``),
            checked against the reader's ``Options`` (a string becomes the option's type);
            options the format does not take are ignored when generic
            (:data:`rlds_cli.formats.base.GENERIC_OPTIONS`), refused otherwise.
        source_info: Extra provenance for the manifest (e.g. the registry id).
        expected_sha256: Refuse a single-file source unless its sha256 is this.
        expected_origin: Who gave ``expected_sha256`` (``"user"``, ``"registry"``, ``"hub"``,
            ``"recorded"``): the hint of a mismatch depends on it.
        progress: Optional callback, see :data:`Progress`.
        license: The data's licence, an SPDX id (``CC-BY-4.0``), kept in the manifest's card
            (:mod:`rlds_cli.cache.card`) over what the source or the registry declares.
        citation: How to cite the data (text, e.g. BibTeX), kept in the card.
        registry_license: The registry entry's licence (``rlds download ID``): kept when it is
            a known SPDX id and the source declares none.
        env: The manifest's ``env`` (:mod:`rlds_cli.cache.env_spec`) when the caller knows it
            and the source does not (``rlds download`` of a D4RL registry entry).

    Returns:
        A :class:`ConvertResult`.

    Raises:
        UnknownLicenseError: ``license`` is no SPDX id rlds knows (before anything is read).
    """
    given = make_card(license=license, citation=citation)
    paths = _as_paths(source)
    # hashing still running when the conversion fails ends with it (the context's exit)
    with SourceHash(expected_sha256, expected_origin, progress) as source_hash:
        if len(paths) == 1 and paths[0].is_file():
            source_hash.begin(paths[0])  # before the detection, whose imports leave a core idle
        options = {k: v for k, v in (options or {}).items() if v is not None}
        cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
        archive = paths[0] if len(paths) == 1 and is_archive(paths[0]) else None
        itself = _reads_archive_itself(archive, format) if archive is not None else None
        if itself is not None:
            archive, format = None, itself  # from here on, a source file like any other
        if archive is not None:
            fmt, files, base = format, [archive], archive.parent
            if fmt is not None:
                options = _checked_options(fmt, options)
        else:
            fmt = format or detect_format(paths[0] if len(paths) == 1 else paths)
            options = _checked_options(fmt, options)  # an unknown --format or option fails before any hashing
            files = source_files(fmt, paths)
            _check_one_file(fmt, paths, files)  # before hashing gigabytes that cannot be converted
            # relative to the files' common folder, so the digest does not depend on how the
            # source was named (a Minari dataset by its directory, its data/ or a file)
            base = Path(os.path.commonpath(files))
            if base.is_file():
                base = base.parent
        source_hash.start(files, base)
        stored_options = {k: v for k, v in options.items() if k not in _RUNTIME_OPTIONS}
        asked, backend = backend, backend or _stored_backend(cache, name)  # --force keeps it too
        mode = FramesMode.parse(frames)
        with DatasetBuilder(name, root=cache, backend=backend, replace=force, frames=mode) as builder:
            if builder.existing is not None and not force:
                old = builder.existing.source
                same_format = old.get("format") == fmt or (archive is not None and fmt is None)
                sha256 = source_hash.checked()[1]  # the reuse check needs the digest first
                same_frames = old.get("frames", "keep") == str(mode)
                if (
                    old.get("sha256") == sha256
                    and same_format
                    and same_frames
                    and old.get("options", {}) == stored_options
                    and all(
                        builder.existing.card.get(k) == v for k, v in given.items() if k != "license_from"
                    )
                ):
                    if asked is not None and asked != builder.existing.backend:
                        raise DatasetExistsError(
                            f"dataset {name!r} holds this source stored as {builder.existing.backend}; "
                            f"storage {asked} was asked for",
                            hint=f"pass --force to convert it again as {asked}, or --name to keep both",
                        )
                    logger.info(
                        "dataset %r already holds %s (sha256 %s): reused", name, files[0], sha256[:12]
                    )
                    return ConvertResult(builder.existing, True, cache.dataset_dir(name))
                raise DatasetExistsError(f"dataset {name!r} already exists in {cache.path}{_origin(old)}")
            extracted: Path | None = None
            try:
                read_paths = paths
                if archive is not None:
                    from rlds_cli.formats.archives import extract_archive

                    extracted = cache.new_build_dir(name)
                    read_paths = [extract_archive(archive, extracted)]
                    fmt = fmt or detect_format(read_paths[0])
                assert fmt is not None
                shown = archive or (paths[0] if len(paths) == 1 else base)
                facts = {
                    "format": fmt,
                    "path": str(shown.resolve()),
                    **dict.fromkeys(("sha256", "size", "files")),  # (from the hash, before the commit)
                    "options": stored_options,
                    **({"frames": str(mode)} if mode.name != "keep" else {}),
                    **({"archive": True} if archive is not None else {}),
                    **(source_info or {}),
                }
                logger.info("converting %s (%s) into %r, backend %s", shown, fmt, name, backend)
                try:
                    cards = (given, registry_license)
                    manifest = _build(
                        builder, fmt, read_paths, options, progress, shown, facts, source_hash, cards, env
                    )
                except Exception:
                    source_hash.checked()  # a file that is not the expected one: say that, not why it fails
                    raise
                logger.info(
                    "published %r: %d steps, %d episodes", name, manifest.num_steps, manifest.num_episodes
                )
            finally:
                if extracted is not None:
                    shutil.rmtree(extracted, ignore_errors=True)
        return ConvertResult(manifest, False, cache.dataset_dir(name))


class SourceHash:
    """The sha256 of the source files, computed on threads beside the conversion.

    Hashing (~1.3 GB/s on one core) costs as much as converting a pixel source, so it overlaps
    reading and writing. :meth:`checked` (the digest against ``expected``) runs before the reuse
    check and before the commit: nothing unchecked is published. :meth:`begin` starts a one-file
    source before format detection; that digest serves the file list the format then reads."""

    def __init__(self, expected: str | None, origin: str, progress: Progress | None) -> None:
        self._expected, self._origin, self._progress = expected, origin, progress
        self._stop = threading.Event()
        self._early: dict[Path, Future[str]] = {}
        self._future: Future[list[dict[str, Any]]] | None = None
        self._first: Path | None = None
        self._done: tuple[list[dict[str, Any]], str] | None = None
        # each file's size, mtime and inode when it began to be read: compared before the commit
        self._seen: dict[Path, tuple[int, int, int]] = {}

    def begin(self, path: Path) -> None:
        """Start hashing ``path`` before the source's file list is known."""
        self._seen.setdefault(path, _signature(path))
        self._early[path] = _on_thread(lambda: sha256_file(path, self._stop))

    def start(self, files: list[Path], base: Path) -> None:
        """Hash ``files`` (paths recorded relative to ``base``), reusing :meth:`begin`'s digest."""
        for f in files:
            self._seen.setdefault(f, _signature(f))
        self._first = files[0]
        self._future = _on_thread(lambda: _hash_files(files, base, self._early, self._stop))

    def stop(self) -> None:
        """End any hashing still running (a failed conversion does not wait for it)."""
        self._stop.set()

    def __enter__(self) -> SourceHash:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def checked(self) -> tuple[list[dict[str, Any]], str]:
        """(per-file records, the source's digest), once hashed; waits for the thread.

        Raises:
            ChecksumMismatchError: The digest is not the expected one.
            ConversionError: A source file changed (size, mtime or inode) since it began to be read.
        """
        if self._done is None:
            assert self._future is not None, "start() comes before checked()"
            hashed = self._future.result()
            changed = [f for f, seen in self._seen.items() if _signature(f) != seen]
            if changed:  # what was read (and hashed) may mix two versions of it
                raise ConversionError(
                    f"source file {changed[0]} changed while it was converted; nothing was published",
                    hint="convert it again once whatever writes it has finished",
                )
            sha256 = hashed[0]["sha256"] if len(hashed) == 1 else _tree_sha256(hashed)
            if self._expected and sha256 != self._expected.lower():
                from rlds_cli.net.layout import mismatch_hint

                raise ChecksumMismatchError(
                    f"{self._first} has sha256 {sha256}, expected {self._expected.lower()}"
                    f"{' (given with --sha256)' if self._origin == 'user' else ''}",
                    hint=mismatch_hint(self._origin),
                )
            if self._progress:
                self._progress("hash", sum(f["size"] for f in hashed))
            self._done = (hashed, sha256)
        return self._done

    def facts(self) -> dict[str, Any]:
        """The manifest's source fields that come from the hash."""
        hashed, sha256 = self.checked()
        return {"sha256": sha256, "size": sum(f["size"] for f in hashed), "files": hashed}


def _reads_archive_itself(archive: Path, fmt: str | None) -> str | None:
    """The format whose reader reads ``archive`` without unpacking it; ``None``: unpack it.

    Gen-DGRL tars (Procgen ``<game>.tar.xz``, tens of GB unpacked) are streamed member by member;
    a replay buffer's ``.zarr.zip`` (UMI's ``ZipStore``) is read in place by zarr. Chosen by
    ``--format`` or, without it, by the reader's sniffer. Such an archive is hashed and recorded
    as one source file.
    """
    from rlds_cli.formats import gen_dgrl, replay_buffer

    low = archive.name.lower()
    if low.endswith(".zip") and (fmt == "replay_buffer" if fmt is not None else replay_buffer.sniff(archive)):
        return "replay_buffer"
    if not low.endswith(gen_dgrl.TAR_SUFFIXES):
        return None
    return "gen_dgrl" if (fmt == "gen_dgrl" if fmt is not None else gen_dgrl.sniff(archive)) else None


def _check_one_file(fmt: str, paths: list[Path], files: list[Path]) -> None:
    """Refuse a source holding several files of a one-file format (a folder of D4RL files),
    naming them and how to convert each (rather than a misleading HDF5 open error)."""
    if not reader_class(fmt).reads_one_file or len(files) <= 1:
        return
    where = str(paths[0]) if len(paths) == 1 else "the sources given"
    names = [f.name for f in files]
    listed = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    if len(paths) == 1 and paths[0].is_file():  # an archive: its files are not paths yet
        hint = f"unpack {paths[0].name} and convert each file on its own ('rlds download FILE')"
    else:
        first, second = (str(f) for f in files[:2])
        hint = (
            f"convert each file on its own, e.g. 'rlds download {first}' then 'rlds download {second}' "
            "(each gets the name of its file; --name picks another)"
        )
    raise SourceFormatError(
        f"{where} holds {len(files)} {fmt.upper()} files ({listed}); the {fmt} format reads one "
        "file at a time",
        hint=hint,
    )


def _origin(source: dict[str, Any]) -> str:
    """What an existing dataset was made from, for the error that refuses to overwrite it."""
    if source.get("format") == "view":
        return f" (a view of {source.get('parent')!r})"
    if source.get("format") == "rlds-preprocess":
        return f" (preprocessed from {source.get('id')!r})"
    return f" (converted from {source['path']})" if source.get("path") else ""


def _build(
    builder: DatasetBuilder,
    fmt: str,
    paths: list[Path],
    options: dict[str, Any],
    progress: Progress | None,
    shown: Path,
    facts: dict[str, Any],
    source_hash: SourceHash,
    cards: tuple[dict[str, Any], str | None] = ({}, None),
    env: dict[str, Any] | None = None,
) -> Manifest:
    """Stream the reader into the builder and commit with the source ``facts``, the checked
    digest, the card (the user's, over the source's and the registry licence of ``cards``) and
    ``env``."""
    from rlds_cli.formats.select import (
        SelectionRecord,
        kept_episodes,
        parse_episodes,
        select_blocks,
        subset_episode_arrays,
    )

    cls = reader_class(fmt)
    options = _checked_options(fmt, options)  # the format of an archive is known only now
    arg: Any = paths[0] if len(paths) == 1 else paths
    if cls.reads_one_file:  # a folder (or an archive's) holds the file
        files = source_files(fmt, paths)
        _check_one_file(fmt, [shown] if shown.is_file() else paths, files)
        arg = files[0]
    episodes = parse_episodes(options["episodes"]) if options.get("episodes") is not None else None
    keys = list(options["keys"]) if options.get("keys") is not None else None
    reader_options = {k: v for k, v in options.items() if k in cls.Options.names()}
    with cls(arg, **reader_options) as reader:
        # a reader that can reads only the selected episodes (their files may be all there is)
        start = reader.select_episodes(*episodes) if episodes is not None else 0
        if progress:
            progress("start", reader.total_rows())
        advance = (lambda rows: progress("advance", rows)) if progress else None
        nan_counts: dict[str, int] = {}
        record = SelectionRecord()
        blocks = select_blocks(
            reader.blocks(advance), episodes=episodes, keys=keys, record=record, source=shown, start=start
        )
        for block in _without_empty_rows(blocks, shown, reader.report.notes):
            _count_nans(block, nan_counts)
            builder.append(block)
        if (
            builder.num_steps == 0
            and episodes is not None
            and start == 0
            and record.episodes_seen <= episodes[0]
        ):
            first, stop = episodes
            raise InvalidSelectionError(
                f"episodes {first}:{'' if stop is None else stop} selects none of the {record.episodes_seen} "
                f"episodes of {shown}",
                hint="episodes are counted from 0 in the source's order: pick a range inside it",
            )
        if builder.num_steps == 0:
            raise SourceFormatError(
                f"{shown} holds no complete transition (every row's next observation is unknown)",
                hint="a row becomes a step only when its next observation is known (the next row of "
                "its episode, or a next_observations key): check the file's episode ends",
            )
        reader.report.nan_counts = nan_counts
        arrays = reader.source_arrays()
        if episodes is not None:  # per-episode arrays keep the kept episodes' rows, row for row
            arrays = subset_episode_arrays(arrays, kept_episodes(episodes, record.episodes_seen))
        facts = {**facts, **source_hash.facts()}
        metadata = strict_json(reader.source_metadata())
        return builder.commit(
            source={**facts, "metadata": metadata, "checks": reader.report.checks()},
            conversion=reader.report.to_dict(),
            source_arrays=arrays,
            card=with_user(declared_card(metadata, cards[1]), cards[0]),
            env=env,
        )
