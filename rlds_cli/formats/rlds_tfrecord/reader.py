"""The reader: options, metadata, shard selection and the column plan, and the stream of blocks
(the shard scan: :mod:`.scan`; assembling: :mod:`.assemble`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlds_cli.errors import MissingExtraError, SourceFormatError, SourceNotFoundError
from rlds_cli.formats._parallel import default_workers, ordered_map
from rlds_cli.formats.base import ConversionReport, Reader, ReaderOptions, StepBlock
from rlds_cli.formats.file_rules import from_layout
from rlds_cli.formats.keys import renamed_note
from rlds_cli.formats.packing import BlockPacker
from rlds_cli.formats.rlds_tfrecord import layout
from rlds_cli.formats.rlds_tfrecord.assemble import _Assembly
from rlds_cli.formats.rlds_tfrecord.columns import _episode_columns, _Plan, _plan_columns
from rlds_cli.formats.rlds_tfrecord.decode import (
    decode_unit,
)
from rlds_cli.formats.rlds_tfrecord.layout import (
    FEATURES_FILE,
    INFO_FILE,
    _inside,
    _read_json,
    _root_and_shards,
    _Shard,
    _shard,
)
from rlds_cli.formats.rlds_tfrecord.scan import _ShardScan
from rlds_cli.formats.tfds_features import IMAGE, parse_features
from rlds_cli.formats.tfrecord_io import (
    HEADER_BYTES,
    have_crc32c,
)
from rlds_cli.tfds_layout import SHARD_NAME

RULES = "rlds-tfrecord-v1"
LAST_STEP_RULES = ("auto", "observation", "transition")
_EXTRA_HINT = "pip install 'rlds-cli[rlds]' (crc32c and pillow)"


@dataclass(frozen=True)
class RldsOptions(ReaderOptions):
    """Options of :class:`RldsTFRecordReader` (its keyword arguments)."""

    split: str | None = None
    last_step: Literal["auto", "observation", "transition"] = "auto"
    workers: int | None = None
    block_rows: int | None = None


@from_layout(layout)  # sniff, source_files and EXPECTED_FILES: formats/rlds_tfrecord/layout.py
class RldsTFRecordReader(_ShardScan, _Assembly, Reader):
    """Streams an RLDS/TFDS TFRecord dataset (a version folder, or one shard) in TED layout."""

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
        self.root, shard_files, self.single = _root_and_shards(self.path)
        self._read_metadata()
        self.shards = self._select_shards([_shard(_inside(self.root, p)) for p in shard_files], split)
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
        self.features_path = _inside(self.root, features_path)
        self.features = parse_features(_read_json(self.features_path, "features"), self.features_path)
        info_path = self.root / INFO_FILE
        self.info: dict[str, Any] = {}
        if info_path.is_file():
            info = _read_json(_inside(self.root, info_path), "dataset info")
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

    def _select_shards(self, shards: list[_Shard], split: str | None) -> list[_Shard]:
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
        columns, wanted = _plan_columns(self.features, self.features_path)
        self.columns = columns
        self.episode_columns = _episode_columns(self.features, self.report)
        self.plan = _Plan(tuple(columns))
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
            try:
                import PIL.Image  # noqa: F401
            except ImportError:
                raise MissingExtraError(
                    f"{self.features_path}: RLDS images are decoded with Pillow, which is not installed",
                    hint=_EXTRA_HINT,
                ) from None
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
