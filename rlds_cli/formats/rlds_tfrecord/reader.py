"""The RLDS TFRecord reader and the files it reads: an RLDS/TFDS dataset folder's shards and splits.

The RLDS TFRecord reader, :class:`RldsTFRecordReader`: metadata, shard selection, the column plan,
the shard scan, decoded pieces assembled into episodes, and the block stream.

The shard scan checks every record of a shard before any is decoded and cuts each episode into
pieces for the workers; assembly applies the flag checks and the last-step rule and keeps the text
tables and per-episode values.

The files of an RLDS/TFDS dataset folder: shard names, splits, the sniff and the files a
conversion reads.

The names and which folder below a path is the dataset folder come from
:mod:`rlds_cli._util.tfds_layout` (the Hub's download plan uses the same rule): a folder holding
one TFDS dataset folder (``name/version/``) at any depth is read from it; several are refused,
naming them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlds_cli._util.tfds_layout import FEATURES_FILE, INFO_FILE, SHARD_NAME, one_tfds_folder
from rlds_cli._util.tfds_layout import is_shard_name as _is_shard_name
from rlds_cli.errors import MissingExtraError, SourceFormatError, SourceNotFoundError, import_extra
from rlds_cli.formats.base import (
    BlockPacker,
    ConversionReport,
    Piece,
    Reader,
    ReaderOptions,
    StepBlock,
    renamed_note,
)
from rlds_cli.formats.folders import default_workers, ordered_map
from rlds_cli.formats.rlds_tfrecord.decode import (
    LAST_STEP_FEATURE,
    REDOWNLOAD_HINT,
    Decoded,
    PieceRef,
    Plan,
    Unit,
    check_record,
    decode_unit,
    episode_columns,
    plan_columns,
)
from rlds_cli.formats.tfds_features import IMAGE, TEXT, parse_features
from rlds_cli.formats.tfrecord_io import (
    HEADER_BYTES,
    FramingError,
    RecordInfo,
    have_crc32c,
    scan_records,
)
from rlds_cli.formats.untrusted import UnsafeSourceError, check_declared, read_json_file, side_array_max_bytes
from rlds_cli.frames.codecs import join_rows

__all__ = [
    "EXPECTED_FILES",
    "FEATURES_FILE",
    "INFO_FILE",
    "Shard",
    "inside_folder",
    "nested_dataset_folder",
    "root_and_shards",
    "shard_from_path",
    "sniff",
    "source_files",
]


@dataclass(frozen=True)
class Shard:
    """One shard file and what its name declares: split, index, shards in the split."""

    path: Path
    split: str
    index: int
    count: int  # shards of the split its name declares (0: not said)


def shard_from_path(path: Path) -> Shard:
    """The shard at ``path`` (split ``""`` and zeros when its name does not follow TFDS's pattern)."""
    match = SHARD_NAME.match(path.name)
    if match is None:
        return Shard(path, "", 0, 0)
    index, count = match.group("index"), match.group("count")
    return Shard(path, match.group("split"), int(index or 0), int(count or 0))


def root_and_shards(path: Path) -> tuple[Path, list[Path], bool]:
    """The dataset folder of ``path``, its shard files (sorted), and whether ``path`` named a
    single shard (then only that one is read)."""
    if path.is_dir():
        root = path if (path / FEATURES_FILE).is_file() else (nested_dataset_folder(path) or path)
    elif path.name in (FEATURES_FILE, INFO_FILE):
        root = path.parent
    else:
        return path.parent, [path], True
    shards = sorted(p for p in root.iterdir() if _is_shard_name(p.name) and p.is_file())
    return root, shards, False


def nested_dataset_folder(folder: Path, names: list[str] | None = None) -> Path | None:
    """The one TFDS dataset folder below ``folder`` (any depth; hidden folders and files left
    out), ``None`` if there is none. ``names``: the files below ``folder``, relative and
    ``/``-separated, when the caller already listed them.

    Raises:
        SourceFormatError: Several of them (the user names one).
    """
    if names is None:
        names = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    found = one_tfds_folder(names, str(folder), str(folder) + "/")
    return None if found is None else folder / found


#: What a source of this format looks like, said in hints (the reader's ``expected_files``).
EXPECTED_FILES = "an RLDS/TFDS folder (Open X-Embodiment): features.json and *.tfrecord-NNNNN-of-NNNNN shards"


def sniff(path: Path) -> bool:
    """Whether ``path`` is an RLDS/TFDS folder (``features.json`` next to ``*.tfrecord*`` shards),
    one of its shards, or its ``features.json``."""
    try:
        if path.is_dir():
            return (path / FEATURES_FILE).is_file() and any(_is_shard_name(p.name) for p in path.iterdir())
        if path.is_file():
            if path.name == FEATURES_FILE:
                return any(_is_shard_name(p.name) for p in path.parent.iterdir())
            return _is_shard_name(path.name) and (path.parent / FEATURES_FILE).is_file()
    except OSError:
        return False
    return False


def inside_folder(root: Path, file: Path) -> Path:
    """``file`` if it stays inside the dataset folder once symlinks are followed."""
    try:
        real = file.resolve()
    except (OSError, RuntimeError) as exc:
        raise UnsafeSourceError(f"{file} cannot be resolved: {exc}") from None
    if not real.is_relative_to(root.resolve()):
        raise UnsafeSourceError(
            f"{file} escapes the dataset folder {root} (to {real})",
            hint="rlds reads only files inside the dataset folder; the dataset is malicious or broken",
        )
    return file


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The files a conversion reads and hashes: ``features.json``, ``dataset_info.json`` and the
    shards (all of the folder's, or the one shard named)."""
    out: list[Path] = []
    for p in paths:
        root, shards, _ = root_and_shards(p)
        meta = [root / name for name in (FEATURES_FILE, INFO_FILE) if (root / name).is_file()]
        out += [inside_folder(root, f) for f in (*meta, *shards)]
    return list(dict.fromkeys(out))


RULES = "rlds-tfrecord-v1"


LAST_STEP_RULES = ("auto", "observation", "transition")


#: Decoded bytes of steps per worker task (a piece of an episode, or several small episodes).
UNIT_BYTES = 8 << 20


#: Side assumed for an image dimension features.json leaves unknown (-1), when planning pieces.
UNKNOWN_SIDE = 512


_EXTRA_HINT = "pip install 'rlds-cli[rlds]' (crc32c and pillow)"


@dataclass(frozen=True)
class RldsOptions(ReaderOptions):
    """Options of :class:`RldsTFRecordReader` (its keyword arguments)."""

    split: str | None = None
    last_step: Literal["auto", "observation", "transition"] = "auto"
    workers: int | None = None
    block_rows: int | None = None


class RldsTFRecordReader(Reader):
    """Streams an RLDS/TFDS TFRecord dataset (a version folder, or one shard) in TED layout."""

    sniff = staticmethod(sniff)
    source_files = staticmethod(source_files)
    expected_files = EXPECTED_FILES

    format_name = "rlds"
    Options = RldsOptions

    def __init__(
        self,
        path: str | Path | Sequence[str | Path],
        *,
        split: str | None = None,
        last_step: str = "auto",
        workers: int | None = None,
        block_rows: int | None = None,
    ) -> None:
        """Plan a conversion of the dataset at ``path``.

        Args:
            path: The version folder (``features.json``, ``dataset_info.json`` and the shards), its
                ``features.json``, or one shard (then only that shard is read).
            split: Which split's shards to read (default: ``train`` when there are several, else
                the only one).
            last_step: ``"auto"``, ``"observation"`` or ``"transition"``: what an episode's last
                step is (see the module doc and ``docs/formats.md``).
            workers: Worker processes decoding pieces (default: the cores for sources over 32 MB).
            block_rows: Most steps per piece and per block (default: about 8 MiB of decoded steps).
        """
        if last_step not in LAST_STEP_RULES:
            raise SourceFormatError(
                f"last_step is {last_step!r}; the rlds format takes {', '.join(map(repr, LAST_STEP_RULES))}"
            )
        if not isinstance(path, str | Path):
            raise SourceFormatError(
                "the rlds format reads one dataset folder (or one shard), got several paths"
            )
        self.path = Path(path)
        if not self.path.exists():
            raise SourceNotFoundError(f"source {self.path} does not exist")
        if not have_crc32c():
            raise MissingExtraError(
                f"{self.path}: TFRecord checksums need a crc32c package, which is not installed",
                hint=_EXTRA_HINT,
            )
        self.last_step = last_step
        self.block_rows = block_rows if block_rows and block_rows > 0 else None
        self.report = ConversionReport(rules=RULES)
        self.root, shard_files, self.single = root_and_shards(self.path)
        self._read_metadata()
        self.shards = self._select_shards(
            [shard_from_path(inside_folder(self.root, p)) for p in shard_files], split
        )
        self._plan()
        total = sum(s.path.stat().st_size for s in self.shards)
        self.workers = workers if workers else default_workers(max(2, len(self.shards)), total)
        self._counts = {"observation": 0, "transition": 0, "dropped": 0, "first": 0, "last": 0}
        self._rule_note = len(self.report.notes)
        self.report.notes.append("")
        self._update_notes()
        self._text_tables: dict[str, dict[str, int]] = {c.key: {} for c in self.columns if c.text}
        self._episode_text: dict[str, dict[str, int]] = {c.key: {} for c in self.episode_columns if c.text}
        self._text_bytes = 0
        self._episode_values: dict[int, dict[str, Any]] = {}
        self._episode_arrays: dict[str, list[np.ndarray]] = {c.key: [] for c in self.episode_columns}
        self._shapes: dict[str, tuple[tuple[int, ...], str]] = {}
        said = [c.key for c in self.episode_columns if c.leaf.name == LAST_STEP_FEATURE and not c.text]
        self._last_step_key = said[0] if said else None
        self._last_step_said: dict[int, bool] = {}

    # ------------------------------------------------------------------ metadata and plan

    def _read_metadata(self) -> None:
        features_path = self.root / FEATURES_FILE
        if not features_path.is_file():
            raise SourceFormatError(
                f"{self.root} has no {FEATURES_FILE}; an RLDS/TFDS dataset folder holds it next to the "
                "shards",
                hint="download the whole dataset version folder (features.json, dataset_info.json and the "
                "shards)",
            )
        self.features_path = inside_folder(self.root, features_path)
        self.features = parse_features(read_json_file(self.features_path, "features"), self.features_path)
        info_path = self.root / INFO_FILE
        self.info: dict[str, Any] = {}
        if info_path.is_file():
            info = read_json_file(inside_folder(self.root, info_path), "dataset info")
            if not isinstance(info, dict):
                raise SourceFormatError(f"{info_path} is not a JSON object")
            self.info = info
        self.info_path = info_path

    def _declared_lengths(self, split: str) -> list[int] | None:
        """Records per shard that ``dataset_info.json`` gives the split (``None``: not said)."""
        for entry in self.info.get("splits") or []:
            if isinstance(entry, dict) and entry.get("name") == split:
                lengths = entry.get("shardLengths", entry.get("shard_lengths"))
                if not isinstance(lengths, list):
                    return None
                try:
                    return [int(x) for x in lengths]
                except (TypeError, ValueError):
                    raise SourceFormatError(
                        f"{self.info_path}: split {split!r} has shardLengths {lengths!r}"
                    ) from None
        return None

    def _select_shards(self, shards: list[Shard], split: str | None) -> list[Shard]:
        if not shards:
            raise SourceFormatError(
                f"{self.root} holds no *.tfrecord* shards",
                hint="download the shards (<name>-<split>.tfrecord-NNNNN-of-NNNNN) next to features.json",
            )
        splits = sorted({s.split for s in shards})
        if split is None:
            split = "train" if "train" in splits else splits[0] if len(splits) == 1 else None
            if split is None:
                raise SourceFormatError(
                    f"{self.root} holds the splits {', '.join(map(repr, splits))} and none is 'train'",
                    hint="pick one: convert(path, name, options={'split': NAME})",
                )
        if split not in splits:
            raise SourceFormatError(
                f"{self.root} has no shards of split {split!r} (splits: {', '.join(map(repr, splits))})"
            )
        if len(splits) > 1:
            others = ", ".join(repr(s) for s in splits if s != split)
            self.report.notes.append(f"split {split!r} read; the folder also holds {others} (option 'split')")
        self.split = split
        chosen = sorted((s for s in shards if s.split == split), key=lambda s: (s.index, s.path.name))
        counts = {s.count for s in chosen}
        self.declared = self._declared_lengths(split)
        if self.single:
            self.report.notes.append(f"one shard read: {chosen[0].path.name}")
            return chosen
        if len(counts) > 1:
            raise SourceFormatError(
                f"{self.root}: the shards of split {split!r} disagree on their count ({sorted(counts)})"
            )
        count = counts.pop()
        if count:
            have = {s.index for s in chosen}
            missing = [i for i in range(count) if i not in have]
            if missing:
                name = SHARD_NAME.sub(r"\g<name>-\g<split>.tfrecord", chosen[0].path.name)
                raise SourceFormatError(
                    f"{self.root}: shard {name}-{missing[0]:05d}-of-{count:05d} is missing "
                    f"({len(missing)} of {count} shards of split {split!r})",
                    hint="the download is incomplete: fetch every shard of the split",
                )
        if self.declared is not None and len(self.declared) != len(chosen):
            raise SourceFormatError(
                f"{self.info_path} gives split {split!r} {len(self.declared)} shards, the folder holds "
                f"{len(chosen)}"
            )
        if self.declared is not None:
            self.report.expected = {"num_episodes": sum(self.declared)}
        return chosen

    def _plan(self) -> None:
        columns, wanted = plan_columns(self.features, self.features_path)
        self.columns = columns
        self.episode_columns = episode_columns(self.features, self.report)
        self.plan = Plan(tuple(columns))
        for name, why in self.features.skipped:
            self.report.notes.append(f"{name}: {why}; not stored")
        keys = {c.leaf.name: c.key for c in columns if c.role != "flag" and c.role != "reward"}
        renamed = renamed_note({k: keys[k] for k in wanted}, wanted)
        if renamed:
            self.report.notes.append(renamed)
        self.keys = {c.leaf.name: c.key for c in [*columns, *self.episode_columns] if c.role != "flag"}
        flags = {c.key for c in columns if c.role == "flag"}
        if "is_terminal" not in flags:
            self.report.notes.append("no steps/is_terminal: every episode ends truncated")
        if not any(c.role == "reward" for c in columns):
            self.report.notes.append("no steps/reward: next/reward = 0")
        if any(c.leaf.kind == IMAGE for c in columns):
            import_extra(
                "PIL.Image", f"{self.features_path}: decoding RLDS images", hint=_EXTRA_HINT, package="Pillow"
            )
        self.obs_keys = [c.key for c in columns if c.role == "obs"]
        self.action_keys = [
            c.key for c in columns if c.role == "step" and (c.key == "action" or c.key.startswith("action/"))
        ]

    def total_rows(self) -> int:
        """Records (episodes) to read: from ``dataset_info.json``, else counted from the headers."""
        if self.declared is not None and not self.single:
            return sum(self.declared)
        count = 0
        for shard in self.shards:
            with open(shard.path, "rb") as fh:
                size, pos = os.fstat(fh.fileno()).st_size, 0
                while pos + HEADER_BYTES <= size:
                    (length,) = np.frombuffer(os.pread(fh.fileno(), 8, pos), "<u8")
                    pos += HEADER_BYTES + int(length) + 4
                    count += 1
        return count

    def source_metadata(self) -> dict[str, Any]:
        info = self.info
        meta: dict[str, Any] = {
            "name": info.get("name"),
            "version": info.get("version"),
            "split": self.split,
            "shards": [s.path.name for s in self.shards],
            "last_step": self.last_step,
            "keys": self.keys,
            "text": {k: list(v) for k, v in self._text_tables.items()},
            "episode_text": {k: list(v) for k, v in self._episode_text.items()},
        }
        description = info.get("description")
        if isinstance(description, str):
            meta["description"] = description[:4000]
        return {"rlds": meta}

    def source_arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for col in self.episode_columns:
            parts = self._episode_arrays[col.key]
            dtype = np.int64 if col.text else np.dtype(str(col.leaf.dtype))
            out[col.key] = np.stack(parts) if parts else np.zeros((0, *col.row_shape), dtype)
        return out

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield the episodes in shard and record order; ``progress`` counts episodes."""
        packer = BlockPacker(self.block_rows)
        for decoded in ordered_map(decode_unit, self._units(), self.workers):
            for piece in decoded:
                part = self._assemble(piece)
                if piece.ref.stop == piece.ref.steps and progress is not None:
                    progress(1)
                if part is not None:
                    yield from packer.add(part)
        yield from packer.finish()

    # ------------------------------------------------------------------ the shard scan

    def _step_bytes(self, counts: dict[str, int], steps: int) -> int:
        """Decoded bytes of one step (images of unknown size planned at :data:`UNKNOWN_SIDE`)."""
        total = 0
        for col in self.columns:
            leaf = col.leaf
            if leaf.kind == IMAGE:
                sides = [d if d >= 0 else UNKNOWN_SIDE for d in leaf.shape]
                total += sides[0] * sides[1] * sides[2] * np.dtype(str(leaf.dtype)).itemsize
            elif leaf.kind == TEXT:
                total += 8
            else:
                itemsize = np.dtype(str(leaf.dtype)).itemsize
                per = counts.get(leaf.name, 0) // steps if steps else leaf.known_values
                total += max(per, leaf.known_values) * itemsize
        return max(total, 1)

    def _where(self, shard: Shard, rec: RecordInfo) -> str:
        return f"{shard.path}: record {rec.index} (byte {rec.offset})"

    def _scan_record(self, shard: Shard, rec: RecordInfo, buf: memoryview, episode: int) -> tuple[int, int]:
        """Check one record against features.json (:func:`.decode.check_record`). Returns its steps
        and the decoded bytes of one step; keeps its episode values."""
        steps, counts, values = check_record(buf, self.columns, self.episode_columns, self._where(shard, rec))
        self._episode_values[episode] = values
        if self._last_step_key is not None:
            self._last_step_said[episode] = bool(np.asarray(values[self._last_step_key]).reshape(-1)[0])
        return steps, self._step_bytes(counts, steps)

    def _scan_shard(
        self, shard: Shard, position: int, first_episode: int
    ) -> list[tuple[RecordInfo, int, int]]:
        """Every record of a shard checked (framing, CRCs, counts), with its steps and step bytes,
        before any of it is decoded."""
        out: list[tuple[RecordInfo, int, int]] = []
        with open(shard.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            try:
                for rec, mapped in scan_records(fh.fileno(), shard.path, size=size):
                    steps, row_bytes = self._scan_record(shard, rec, mapped.view, first_episode + len(out))
                    out.append((rec, steps, row_bytes))
            except FramingError as exc:
                raise SourceFormatError(str(exc), hint=REDOWNLOAD_HINT) from None
            except OSError as exc:  # a read or mapping that fails (I/O error, out of address space)
                raise SourceFormatError(f"{shard.path} cannot be read: {exc}") from None
        slot = shard.index if self.single else position
        if self.declared is not None and slot < len(self.declared):
            declared = self.declared[slot]
            if declared != len(out):
                raise SourceFormatError(
                    f"{shard.path} holds {len(out)} records, but {INFO_FILE} gives it {declared} "
                    "(shardLengths)",
                    hint="the shard is truncated or not the one the dataset lists: download it again",
                )
        # untrusted input: a small shard cannot make rlds write far more than it stores
        decoded = sum(steps * row_bytes for _, steps, row_bytes in out)
        check_declared(shard.path, "steps", decoded, size, how="stores")
        return out

    def _pieces(
        self, shard: Shard, rec: RecordInfo, steps: int, row_bytes: int, episode: int
    ) -> list[PieceRef]:
        """One episode cut into pieces of about :data:`UNIT_BYTES` (or ``block_rows`` steps); the
        last piece keeps at least two steps, so the last-step rule sees its step ``T - 2`` too."""
        rows = self.block_rows or max(1, UNIT_BYTES // row_bytes)
        starts = list(range(0, steps, rows)) or [0]
        if len(starts) > 1 and steps - starts[-1] == 1:
            starts.pop()
        stops = [*starts[1:], steps]
        return [
            PieceRef(str(shard.path), rec.index, rec.offset, rec.length, steps, a, b, episode)
            for a, b in zip(starts, stops, strict=True)
        ]

    def _units(self) -> Iterator[Unit]:
        """Worker tasks in shard order, each about :data:`UNIT_BYTES` of decoded steps."""
        pending: list[PieceRef] = []
        size = rows = 0
        episode = 0
        for position, shard in enumerate(self.shards):
            for rec, steps, row_bytes in self._scan_shard(shard, position, episode):
                for piece in self._pieces(shard, rec, steps, row_bytes, episode):
                    pending.append(piece)
                    size += (piece.stop - piece.start) * row_bytes
                    rows += piece.stop - piece.start
                    if size >= UNIT_BYTES or (self.block_rows and rows >= self.block_rows):
                        yield Unit(self.plan, pending)
                        pending, size, rows = [], 0, 0
                episode += 1
        if pending:
            yield Unit(self.plan, pending)

    # ------------------------------------------------------------------ assembling pieces

    def _index(self, table: dict[str, int], text: str, where: str, key: str) -> int:
        index = table.get(text)
        if index is None:
            self._text_bytes += len(text.encode("utf-8", errors="replace")) + 8
            limit = side_array_max_bytes()
            if self._text_bytes > limit:
                raise UnsafeSourceError(
                    f"{where}: the distinct strings of {key!r} and the other text features take over "
                    f"{limit:,} bytes, the limit for tables kept in the manifest",
                    hint="if you trust the dataset, raise RLDS_SIDE_ARRAY_MAX_BYTES",
                )
            index = table[text] = len(table)
        return index

    def _check_flags(self, decoded: Decoded) -> None:
        ref = decoded.ref
        rows = np.arange(ref.start, ref.stop)
        first = decoded.flags.get("is_first")
        if first is not None:
            late = rows[first & (rows > 0)]
            if len(late):
                raise SourceFormatError(
                    f"{ref.where}: is_first is set on step {int(late[0])} of {ref.steps}; rlds reads one "
                    "episode per record (is_first on step 0 only)"
                )
            if ref.start == 0 and not first[0]:
                self._counts["first"] += 1
        for name in ("is_last", "is_terminal"):
            flag = decoded.flags.get(name)
            if flag is None:
                continue
            early = rows[flag & (rows < ref.steps - 1)]
            if len(early):
                raise SourceFormatError(
                    f"{ref.where}: {name} is set on step {int(early[0])} of {ref.steps}, before the last step"
                )
        last = decoded.flags.get("is_last")
        if last is not None and ref.stop == ref.steps and not last[-1]:
            self._counts["last"] += 1

    def _check_shapes(self, columns: dict[str, np.ndarray], where: str) -> None:
        """Every piece's rows have the shape and dtype of the first piece's (sizes features.json
        leaves unknown are fixed by the first episode)."""
        for key, rows in columns.items():
            spec = (tuple(rows.shape[1:]), rows.dtype.str)
            first = self._shapes.setdefault(key, spec)
            if spec != first:
                raise SourceFormatError(
                    f"{where}: {key!r} has rows of shape {list(spec[0])}, earlier episodes {list(first[0])}"
                )

    def _last_is_observation(self, decoded: Decoded) -> bool:
        """Whether the last step is the final observation only (the last-step rule)."""
        if self.last_step != "auto":
            return self.last_step == "observation"
        said = self._last_step_said.pop(decoded.ref.episode, None)
        if said is not None:  # an export of rlds says it, episode by episode
            return said
        keys = [*self.action_keys, "next/reward"]
        return all(not np.any(decoded.columns[k][-1] != 0) for k in keys if k in decoded.columns)

    def _assemble(self, decoded: Decoded) -> Piece | None:
        """A decoded piece as the rows it adds (the last-step rule applied on an episode's last piece);
        ``None`` when it adds none (an empty episode, or one step that is only a final observation)."""
        ref = decoded.ref
        if ref.steps == 0:
            self.report.dropped_episodes += 1
            self._episode_values.pop(ref.episode, None)
            return None
        if ref.start == 0:
            self.report.source_rows += ref.steps
        self._check_flags(decoded)
        columns: dict[str, Any] = dict(decoded.columns)  # arrays, and image files kept as they are
        for key, texts in decoded.texts.items():
            table = self._text_tables[key]
            index = np.array([self._index(table, s, ref.where, key) for s in texts], np.int64)
            columns[key] = index.reshape(len(index), *(() if key in self.obs_keys else (1,)))
        self._check_shapes(columns, ref.where)
        obs = {k: columns[k] for k in self.obs_keys}
        steps = {k: v for k, v in columns.items() if k not in obs}
        if "next/reward" not in steps:
            steps["next/reward"] = np.zeros((len(next(iter(obs.values()))), 1), np.float32)
        if ref.stop < ref.steps:
            return Piece(ref.where, obs, steps, False, source_id=ref.episode, last=False)
        terminated = bool(decoded.flags["is_terminal"][-1]) if "is_terminal" in decoded.flags else False
        observation = self._last_is_observation(decoded)
        if observation:
            self._counts["observation"] += 1
            if any(np.any(steps[k][-1] != 0) for k in [*self.action_keys, "next/reward"] if k in steps):
                self.report.dropped_rows += 1  # a forced rule discarded a real action or reward
            if ref.steps == 1:
                self.report.dropped_episodes += 1
                self._counts["dropped"] += 1
                self._episode_values.pop(ref.episode, None)
                self._update_notes()
                return None
            steps = {k: v[:-1] for k, v in steps.items()}
        else:
            self._counts["transition"] += 1
            self.report.synthesized_final_observations += 1
            obs = {k: join_rows([v, v[-1:]]) for k, v in obs.items()}
        self._keep_episode_values(ref)
        self._update_notes()
        return Piece(ref.where, obs, steps, terminated, source_id=ref.episode, final_known=observation)

    def _keep_episode_values(self, ref: PieceRef) -> None:
        values = self._episode_values.pop(ref.episode, {})
        for col in self.episode_columns:
            value = values[col.key]
            if col.text:
                value = np.int64(self._index(self._episode_text[col.key], value, ref.where, col.key))
            self._episode_arrays[col.key].append(np.asarray(value))

    def _update_notes(self) -> None:
        """The rule's notes, kept current episode by episode (``--episodes A:B`` may stop reading early)."""
        c = self._counts
        text = (
            f"last_step={self.last_step!r}: {c['observation']} episode(s) end with a step that is the "
            f"final observation only (final_known = true), {c['transition']} keep their last step as a "
            "transition whose next observation is unknown (final_known = false; the final observation "
            "repeats the last one)"
        )
        if c["dropped"]:
            text += f"; {c['dropped']} episode(s) of one step had no transition and were dropped"
        if c["first"]:
            text += f"; {c['first']} episode(s) do not set is_first on step 0"
        if c["last"]:
            text += f"; {c['last']} episode(s) do not set is_last on their last step"
        self.report.notes[self._rule_note] = text
