"""Export a cached dataset to the formats other tools read, streaming in bounded chunks.

| format      | what is written                                    | read back with                          |
|-------------|----------------------------------------------------|-----------------------------------------|
| `torchrl`   | a tensordict memmap directory (TED, full)          | `TensorDict.load_memmap(path)`          |
| `d4rl`      | one D4RL HDF5 file, with `next_observations`      | `rlds download FILE --format d4rl`, h5py |
| `npz`       | the same arrays as `d4rl`, in one `.npz`           | `numpy.load(path)`                      |
| `minari`    | a Minari HDF5 dataset directory                    | `minari.load_dataset` / `rlds download` |
| `lerobot`   | a LeRobot v3.0 (or v2.1) directory (parquet + mp4) | `LeRobotDataset` / `rlds download`      |
| `amago`     | an AMAGO trajectory folder (one `.npz` each)       | AMAGO's loader / `rlds download`        |
| `robomimic` | one robomimic HDF5 file (`data/demo_N`, `mask/*`)  | `SequenceDataset` / `rlds download`     |
| `rlds`      | an RLDS TFRecord folder (TFDS's layout)            | `tfds.builder_from_directory`           |

What every exporter shares lives here too: chunked reads (:func:`iter_chunks`), an output written
beside its target and renamed into place (:func:`atomic_target`), the keys written per step and
per observation (:func:`step_keys`, :func:`flat_keys`).
"""

from __future__ import annotations

import inspect
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli._util import signals
from rlds_cli._util.io import check_disk, exchange, make_parent, temp_path, temp_paths_of
from rlds_cli._util.lazy import resolve
from rlds_cli._util.locks import pid_alive
from rlds_cli.cache.compose import verify_parent
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.episode_table import SEED_KEY, SEED_PRESENT_KEY
from rlds_cli.cache.layout import HUB_EXPORT_MARK, TMP_DIR
from rlds_cli.cache.root import CacheRoot, enclosing_cache, overlap, target_problem
from rlds_cli.cache.ted import TedBatch
from rlds_cli.errors import DiskFullError, ExportError, UnknownFormatError, is_disk_full

EXPORTERS: dict[str, str] = {
    "torchrl": "rlds_cli.export.torchrl_memmap:export_torchrl",
    "d4rl": "rlds_cli.export.d4rl:export_d4rl",
    "npz": "rlds_cli.export.d4rl:export_npz",
    "minari": "rlds_cli.export.minari:export_minari",
    "lerobot": "rlds_cli.export.lerobot:export_lerobot",
    "amago": "rlds_cli.export.amago:export_amago",
    "robomimic": "rlds_cli.export.robomimic:export_robomimic",
    "rlds": "rlds_cli.export.rlds_tfrecord:export_rlds",
}


def export_dataset(
    dataset: Dataset,
    out: str | os.PathLike[str],
    format: str,
    *,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    options: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``dataset`` to ``out`` in ``format`` (see the table above).

    The dataset's files and content digests are checked first (a damaged dataset is refused, naming
    the key). The output is written under a temporary name beside ``out`` and renamed into place when
    complete: a killed export leaves no half-written file. A growing dataset (written by
    :class:`~rlds_cli.DatasetWriter`) is exported as of one view, from a hard-link copy of its files
    (:func:`~rlds_cli.cache.growing.snapshot_copy`), so writers, evictions and compactions may go
    on meanwhile, whatever the grace period.

    Args:
        dataset: An opened dataset.
        out: The file (``d4rl``, ``npz``, ``robomimic``) or directory (the other formats) to create.
        format: One of :data:`EXPORTERS`.
        overwrite: Replace ``out`` if it exists.
        progress: Called after each chunk with the number of steps it wrote (the calls add up to the
            dataset's steps); an exception it raises breaks the export off, leaving nothing.
        options: The format's own options, by name (``rlds``: ``image_codec``, ``shard_bytes``;
            ``lerobot``: ``version``, ``"3.0"`` or ``"2.1"``).

    Returns:
        The path written.
    """
    exporter = resolve(EXPORTERS, format, what="export format", error=UnknownFormatError)
    _refuse_target(dataset, out)
    _refuse_dict_action(dataset, format)
    _refuse_renumbered_instructions(dataset, format)
    kwargs = dict(options or {})
    accepted = inspect.signature(exporter).parameters
    for option in kwargs:
        if option not in accepted or option in ("overwrite", "progress"):
            own = [o for o in accepted if o not in ("dataset", "out", "overwrite", "progress")]
            raise ExportError(
                f"the {format} export takes no option {option!r}",
                hint=f"its options: {', '.join(own) or 'none'}",
            )
    from rlds_cli.cache.growing import GrowingDataset

    if isinstance(dataset, GrowingDataset):
        from rlds_cli.cache.growing import snapshot_copy

        with snapshot_copy(dataset) as copy:
            view = GrowingDataset(copy)
            _refuse_empty(view)
            verify_parent(view, shown_at=dataset.directory)
            return exporter(view, Path(out), overwrite=overwrite, progress=progress, **kwargs)
    _refuse_empty(dataset)
    verify_parent(dataset)  # damaged values are never copied out as if they were data
    return exporter(dataset, Path(out), overwrite=overwrite, progress=progress, **kwargs)


def _refuse_replacing_cwd(out: str | os.PathLike[str]) -> None:
    """Refuse an ``out`` that is the current folder, a folder holding it, or the home folder: ``..``
    with ``--force`` removed the folder the user was in and everything beside it."""
    if not str(out).strip():
        raise ExportError("the export's path is empty", hint="name the file or folder to write, e.g. ./NAME")
    where, here = Path(out).resolve(), Path.cwd().resolve()
    try:
        home: Path | None = Path.home().resolve()
    except RuntimeError:  # no HOME and no passwd entry (a container's uid): no home to protect
        home = None
    if where in (here, home) or where in here.parents:
        raise ExportError(
            f"{out} is {where}, the current folder, a folder holding it or the home folder: an export "
            "there would replace it and everything in it",
            hint="export to a path of its own, e.g. ./NAME-export",
        )


def _refuse_target(dataset: Dataset, out: str | os.PathLike[str]) -> None:
    """Refuse an ``out`` that is a URL (an export writes local files) or that is, lies inside or
    holds the dataset or its cache: writing there, or replacing it (``overwrite``), would write over
    or remove their files."""
    if "://" in str(out):
        raise ExportError(
            f"{out} is a URL: an export is written to a local file or folder",
            hint="export to a local path and copy it to the store, or share the dataset itself with "
            "'rlds push NAME URL' (--to lerobot also exports to hf://datasets/ORG/REPO)",
        )
    cache = enclosing_cache(dataset.directory)
    if cache is not None and overlap(out, cache / TMP_DIR) == "lies inside":
        build = Path(os.path.realpath(out)).relative_to(os.path.realpath(cache / TMP_DIR)).parts[0]
        if HUB_EXPORT_MARK in build:
            cache = None  # the Hub export's own build in tmp/: it writes there first
    problem = target_problem(out, dataset.directory, dataset.name, cache)
    if problem is not None:
        raise ExportError(
            f"{out} {problem}: the export would write over or remove its files",
            hint="export to a path outside the cache's own folders (RLDS_HOME/datasets, tmp, ...)",
        )
    _refuse_source_files(out, cache)
    _refuse_replacing_cwd(out)  # before the digests are checked, not after


def _refuse_source_files(out: str | os.PathLike[str], cache: Path | None) -> None:
    """Refuse an ``out`` that is, holds or lies inside the file or folder a dataset of ``cache``
    was converted from (its ``source.path``): ``--force`` wrote over a source that 'rlds verify'
    checks, and that the user may have no other copy of."""
    if cache is None:
        return
    for manifest in CacheRoot(cache).iter_manifests():
        source = manifest.source.get("path")
        if not isinstance(source, str) or "://" in source or not os.path.lexists(source):
            continue  # a source removed since is no one's file
        how = overlap(out, source)
        if how is not None:
            raise ExportError(
                f"{out} {how} the source dataset {manifest.name!r} was converted from ({source}): "
                "the export would write over or into it",
                hint="export to a path of its own ('rlds verify' checks a dataset against its source)",
            )


#: The formats that keep an action of several keys (``action/<k>``, a dict action space); the
#: others have one action array.
DICT_ACTION_FORMATS = ("minari", "rlds")


#: The formats that write language instructions as text (the others write an index column's numbers).
TEXT_INSTRUCTION_FORMATS = ("rlds", "lerobot", "robomimic")


def _refuse_renumbered_instructions(dataset: Dataset, format: str) -> None:
    """Refuse, for a format that keeps an instruction index column as numbers, a merge whose parts
    number their instructions each in their own table: one number would stand for different texts
    in one file."""
    instructions = dataset.instructions
    if format in TEXT_INSTRUCTION_FORMATS or instructions is None or not instructions.maps:
        return
    raise ExportError(
        f"{dataset.name}: its parts number their language instructions ({instructions.step_key}) each in "
        f"their own table, and {format} keeps only the numbers: one number would stand for different texts",
        hint=f"export to {', '.join(TEXT_INSTRUCTION_FORMATS)}, which write the texts",
    )


def _refuse_dict_action(dataset: Dataset, format: str) -> None:
    """Refuse a dataset without an action, or whose action is several keys for a format with one
    action array."""
    fields = dataset.stored_fields
    parts = sorted(k for k in fields if k.startswith("action/"))
    if "action" not in fields and not parts:
        raise ExportError(f"{dataset.name} has no action key; the {format} format holds one")
    if format not in DICT_ACTION_FORMATS and "action" not in fields:
        raise ExportError(
            f"{dataset.name} has no single 'action' array ({', '.join(parts)}: a dict action space?); "
            f"the {format} format holds one",
            hint=f"export to {' or '.join(DICT_ACTION_FORMATS)}, which keep dict actions",
        )


def _refuse_empty(dataset: Dataset) -> None:
    """Refuse a dataset without an episode (a growing one before its first commit): no format's
    reader takes an empty file back."""
    if dataset.num_episodes == 0:
        raise ExportError(
            f"dataset {dataset.name!r} holds no episode yet: there is nothing to export",
            hint="export it once a writer has committed episodes",
        )


def refuse_complex(dataset: Dataset, target: str) -> None:
    """Refuse a dataset holding complex numbers for a format without a complex type (one line
    naming the key; a cast would drop the imaginary parts)."""
    for key, spec in dataset.stored_fields.items():
        if np.dtype(spec.dtype).kind == "c":
            raise ExportError(
                f"{dataset.name}: {key!r} holds complex numbers ({np.dtype(spec.dtype)}), which {target} "
                "has no type for",
                hint="export to robomimic, whose HDF5 keeps complex arrays",
            )


#: Steps per chunk when streaming a dataset out.
CHUNK_STEPS = 1 << 16


def raw_bytes(dataset: Dataset, rows: Mapping[str, int], dtypes: Mapping[str, str] | None = None) -> int:
    """Bytes of ``rows[key]`` rows of each key written uncompressed at its TED shape and dtype
    (frames decoded), or at ``dtypes[key]`` where the export widens a key: what an HDF5 export
    needs on disk."""
    fields = dataset.fields
    written = {k: (dtypes or {}).get(k, fields[k][1]) for k in rows}
    row = {k: int(np.prod(fields[k][0], dtype=np.int64)) * np.dtype(written[k]).itemsize for k in rows}
    return sum(n * row[k] for k, n in rows.items())


def iter_chunks(dataset: Dataset, keys: list[str] | None = None) -> Iterator[tuple[int, TedBatch]]:
    """``(start, batch)`` for consecutive step ranges of at most :data:`CHUNK_STEPS`."""
    for start in range(0, dataset.num_steps, CHUNK_STEPS):
        stop = min(start + CHUNK_STEPS, dataset.num_steps)
        yield start, dataset.gather(np.arange(start, stop), keys)


_DISK_HINT = "free space there, or export to another disk"
#: The first bytes of every HDF5 file (d4rl, robomimic exports) and of every ``.npz`` (a zip).
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
NPZ_SIGNATURES = (b"PK\x03\x04", b"PK\x05\x06")


@contextmanager
def atomic_target(
    out: Path, *, overwrite: bool, folder: str | None, begins: tuple[bytes, ...] = (), need: int = 0
) -> Iterator[Path]:
    """Yield a temporary path beside ``out`` (a file or a folder); on success it replaces ``out``.
    ``out`` may not be the current folder, a folder holding it, or the home folder
    (:func:`_refuse_replacing_cwd`). ``folder`` is the file every export of a folder format writes
    (``meta.json``); ``None``: the export is one file, which begins with one of ``begins``. An
    export replaces only an earlier one (``--force`` removed a folder of the user's files, or
    wrote over any file): one file never replaces a folder, and replaces only an empty file or
    one that begins as its format does; a folder export replaces only a folder holding its
    ``folder`` file, or an empty one.

    Raises:
        DiskFullError: The disk has not ``need`` bytes free (checked first: HDF5 meeting a full disk
            can end the process with a segfault as it cleans up), or filled up while writing.
    """
    _refuse_replacing_cwd(out)
    _refuse_link(out)
    if out.exists() and not overwrite:
        raise ExportError(f"{out} already exists", hint="pass --force to replace it, or pick another path")
    if folder is None and out.is_dir():
        raise ExportError(
            f"{out} is a folder, and this export is one file: --force replaces an earlier export, "
            "never a folder", hint=f"name the file to write, e.g. {out / 'NAME'}",
        )  # fmt: skip
    if folder is None and out.is_file() and out.stat().st_size and not _begins(out, begins):
        raise ExportError(
            f"{out} is a file that is no earlier export of this format (it does not begin as one "
            "does): --force replaces an earlier export, never another file",
            hint=f"export to a path of its own, or remove {out} yourself",
        )
    if folder is not None and out.exists() and not out.is_dir():
        raise ExportError(
            f"{out} is a file, and this export is a folder: --force replaces an earlier export, "
            "never a file", hint=f"export to a path of its own, e.g. {out}-export",
        )  # fmt: skip
    if folder is not None and out.is_dir() and not (out / folder).exists() and any(out.iterdir()):
        raise ExportError(
            f"{out} is a folder that holds no earlier export of this format (no {folder}): --force "
            "replaces an earlier export, never a folder of other files",
            hint=f"export to a path of its own, e.g. {out / 'NAME'}, or remove {out} yourself",
        )
    make_parent(out, ExportError)
    _remove_dead_partials(out)
    # HDF5's own structures (groups, attributes, chunk indexes) take little beside the data
    check_disk(out.parent, need, f"the export to {out.name}", hint=_DISK_HINT, margin=need // 100)
    tmp = temp_path(out, suffix=PARTIAL_SUFFIX)
    try:
        try:
            yield tmp
        except (OSError, RuntimeError) as exc:
            if is_disk_full(exc):  # the OS error names no file, or the temporary one
                raise DiskFullError(f"no space left on the device writing {out}", hint=_DISK_HINT) from None
            if isinstance(exc, OSError) and exc.filename is None:  # h5py's names no file
                exc.filename = str(out)
            raise
        with signals.publishing(str(out)):
            _replace(out, tmp, overwrite=overwrite)
    except BaseException:
        _remove(tmp)
        raise


def _begins(path: Path, signatures: tuple[bytes, ...]) -> bool:
    """Whether the file ``path`` begins with one of ``signatures`` (an unreadable one does not)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(max((len(s) for s in signatures), default=0))
    except OSError:
        return False
    return any(head.startswith(s) for s in signatures)


def _replace(out: Path, new: Path, *, overwrite: bool) -> None:
    """Put the finished export ``new`` at ``out``: at every moment ``out`` is the old version whole
    or the new one (a folder is swapped in one step where the system can, else moved aside first).

    Raises:
        ExportError: ``out`` appeared during the export and ``overwrite`` is false, or is a link.
    """
    present = out.exists() or out.is_symlink()
    if present and not overwrite:
        raise ExportError(
            f"{out} appeared during the export (it was not there when the export began); nothing was "
            "written there",
            hint="pass --force to replace it, or pick another path",
        )
    _refuse_link(out)
    if not present or not (out.is_dir() or new.is_dir()):
        os.replace(new, out)  # a file over a file (or nothing) is replaced in one step
        return
    if exchange(new, out):  # ``new`` now holds the old version
        _remove(new)
        return
    # a temporary name of this process other than ``new``'s (thread 0), which a later export's
    # clean-up of killed ones finds (a kill here leaves both versions beside ``out``)
    old = temp_path(out, suffix=PARTIAL_SUFFIX, thread=0)
    os.replace(out, old)
    os.replace(new, out)
    _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _refuse_link(out: Path) -> None:
    if out.is_symlink():
        raise ExportError(
            f"{out} is a symbolic link (to {os.readlink(out)}): an export replaces its target path itself, "
            "not what a link points to",
            hint="export to the path the link points to, or remove the link",
        )


def refuse_unwritten(dataset: Dataset, target: str, kept: Callable[[str], bool]) -> None:
    """Refuse a dataset holding keys ``target``'s layout has no place for (``kept``: whether the
    export writes a stored flat or step key other than the TED core ones): dropped, they would not
    come back, without a word."""
    # the reset seeds are written where the format keeps them (minari) and left out elsewhere,
    # as the episode index's final_known flags are
    seeds = (SEED_KEY, SEED_PRESENT_KEY)
    left = [k for k in [*flat_keys(dataset), *step_keys(dataset)] if k not in seeds and not kept(k)]
    if left:
        raise ExportError(
            f"{dataset.name}: {target} has no place for the key(s) {', '.join(left)}, which the export would "
            "drop",
            hint="export to torchrl or robomimic, which keep every key, or make a copy without them "
            "(rlds preprocess NAME --fn ...)",
        )


#: The suffix of an export's temporary name beside its output (``.<name>.<pid>.<thread>.partial``).
PARTIAL_SUFFIX = ".partial"


#: A temporary name unchanged this long, of a process not running here, is a killed export's (a
#: process of another machine sharing the folder has the same pid test: its writes keep it new).
PARTIAL_IDLE_SECONDS = 15 * 60


def _remove_dead_partials(out: Path) -> None:
    """Remove what exports to ``out`` killed before their rename left beside it: temporary names of
    processes that are gone, unchanged for :data:`PARTIAL_IDLE_SECONDS` (a running export's is
    kept)."""
    for left, pid in temp_paths_of(out, suffix=PARTIAL_SUFFIX):
        if pid_alive(pid):
            continue
        try:
            files = [left, *left.rglob("*")] if left.is_dir() and not left.is_symlink() else [left]
            changed = max(f.lstat().st_mtime for f in files)
        except OSError:  # removed meanwhile
            continue
        if time.time() - changed < PARTIAL_IDLE_SECONDS:
            continue
        if left.is_dir() and not left.is_symlink():
            shutil.rmtree(left, ignore_errors=True)
        else:
            left.unlink(missing_ok=True)


def step_keys(dataset: Dataset) -> list[str]:
    """Stored per-step keys other than the TED core ones (``info/...`` and friends)."""
    core = {"action", "next/reward", "next/terminated", "next/truncated"}
    return [k for k, s in dataset.stored_fields.items() if s.storage == "step" and k not in core]


def flat_keys(dataset: Dataset) -> list[str]:
    """Observation-like keys (stored once, read as ``key`` and ``next/key``)."""
    return [k for k, s in dataset.stored_fields.items() if s.storage == "flat"]
