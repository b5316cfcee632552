""":class:`MinariReader`: a Minari dataset (any storage) streamed episode by episode into flat TED
(the rules: :mod:`rlds_cli.formats.minari`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import ConversionReport, Reader, StepBlock, from_layout
from rlds_cli.formats.base import column as _column
from rlds_cli.formats.hdf5_util import to_jsonable
from rlds_cli.formats.keys import clean_keys, is_text, renamed_note, text_note
from rlds_cli.formats.minari import layout
from rlds_cli.formats.minari.layout import (
    ARROW_FORMATS,
    MAIN_FILE,
    METADATA_FILE,
    SPACE_KEYS,
    Leaf,
    Store,
    as_seed,
    data_dir_of,
    read_metadata,
)
from rlds_cli.formats.minari.storages import ArrowStore, Hdf5Store
from rlds_cli.formats.packing import BlockPacker, Episode, EpisodeSchema


@from_layout(layout)  # sniff, source_files and EXPECTED_FILES: formats/minari/layout.py
class MinariReader(Reader):
    """Streams a Minari dataset (HDF5, Arrow or Parquet storage) as :class:`StepBlock` s.

    Args:
        path: The dataset directory (holding ``data/``), its ``data/`` directory, one of its files,
            a namespace directory holding one dataset, or a list of its files.
    """

    format_name = "minari"

    def __init__(self, path: str | Path | Sequence[str | Path]) -> None:
        paths = [Path(p) for p in ([path] if isinstance(path, str | Path) else path)]
        self.data_dir = data_dir_of(paths[0])
        self.path = self.data_dir
        self.report = ConversionReport(rules="minari-v2")
        self._meta = read_metadata(self.data_dir)
        self._spaces: dict[str, Any] = {
            "observations": self._meta.get("observation_space"),
            "actions": self._meta.get("action_space"),
        }
        self.jpeg_encoding = bool(self._meta.get("jpeg_encoding", True))
        fmt = self._meta.get("data_format", "hdf5")
        self.data_format = fmt
        self._store: Store
        if fmt == "hdf5":
            self._store = Hdf5Store(self.data_dir / MAIN_FILE)
        elif fmt in ARROW_FORMATS:
            self._store = ArrowStore(self.data_dir, fmt, self._spaces, self.jpeg_encoding)
        else:
            raise SourceFormatError(
                f"{self.data_dir / METADATA_FILE}: unknown Minari data_format {fmt!r}",
                hint="Minari writes 'hdf5', 'arrow' or 'parquet'; re-create the dataset with minari",
            )
        try:
            self._inspect()
        except BaseException:
            self._store.close()
            raise

    def close(self) -> None:
        self._store.close()

    # ------------------------------------------------------------------ metadata and schema
    def _inspect(self) -> None:
        store = self._store
        ids = store.episode_ids()
        self.episode_ids = ids
        declared = self._meta.get("total_episodes")
        if isinstance(declared, int) and declared != len(ids):
            raise SourceFormatError(store.count_mismatch(declared, ids))
        self.report.expected = {
            k: int(self._meta[m])
            for k, m in (("num_episodes", "total_episodes"), ("num_steps", "total_steps"))
            if isinstance(self._meta.get(m), int)
        }
        leaves = store.plan(ids[0], self._spaces)
        # one cleaner for every reader: 'pos x' and 'pos_x' never share a key
        wanted = {leaf.path.decode(): tuple(leaf.key.split("/")) for leaf in leaves}
        cleaned = clean_keys(wanted)
        self._leaves = [dataclasses.replace(leaf, key=cleaned[leaf.path.decode()]) for leaf in leaves]
        renamed = renamed_note(cleaned, wanted)
        if renamed:
            self.report.notes.append(renamed)
        if "num_steps" in self.report.expected:
            self._total = self.report.expected["num_steps"]  # progress only; checked after conversion
        else:
            self._total = store.count_steps(ids)
        self.report.source_rows = self._total
        self._text_keys: set[str] = set()

    def total_rows(self) -> int:
        return self._total

    def source_metadata(self) -> dict[str, Any]:
        """``minari``: metadata.json (inner JSON strings decoded) less the spaces and env specs, which go
        under ``spaces`` with the source path of every TED key."""
        spaces: dict[str, Any] = {
            # each space is the JSON object minari.serialization.serialize_space writes
            "serializer": "minari",
            "observation_space": self._meta.get("observation_space"),
            "action_space": self._meta.get("action_space"),
            "env_spec": self._meta.get("env_spec"),
            "jpeg_encoding": self.jpeg_encoding,
            "paths": {
                leaf.key: leaf.path.decode()
                for leaf in self._leaves
                if leaf.role in ("obs", "action", "info") and leaf.key not in self._text_keys
            },
        }
        if "eval_env_spec" in self._meta:
            spaces["eval_env_spec"] = self._meta["eval_env_spec"]
        return {"minari": {k: v for k, v in self._meta.items() if k not in SPACE_KEYS}, "spaces": spaces}

    def source_arrays(self) -> dict[str, np.ndarray]:
        present = getattr(self, "_seed_present", None)
        if present is not None and present.any():
            return {"minari/episode_seed": self._seeds, "minari/episode_seed_present": present}
        return {}

    # ------------------------------------------------------------------ reading

    def _episode(self, i: int) -> Episode:
        label, columns, seed = self._store.read(i, self._leaves)
        obs: dict[str, np.ndarray] = {}
        steps: dict[str, np.ndarray] = {}
        infos: dict[str, np.ndarray] = {}
        flags: dict[str, np.ndarray] = {}
        actions: list[tuple[Leaf, np.ndarray]] = []
        for leaf, data in columns:
            if is_text(data.dtype):  # strings: never stored as object pointers
                if leaf.role not in ("obs", "info"):  # actions, rewards and flags must be numbers
                    raise SourceFormatError(
                        f"{label}: {leaf.path.decode()!r} holds text, which is not supported there "
                        "(actions, rewards and flags must be numbers)",
                        hint="rlds stores numeric arrays only; fix the named dataset of the file",
                    )
                if leaf.key not in self._text_keys:
                    self._text_keys.add(leaf.key)
                    self.report.notes.append(text_note(leaf.key, data.dtype))
                continue
            if leaf.role == "action":
                actions.append((leaf, data))
                steps[leaf.key] = data
            else:
                {"obs": obs, "info": infos}.get(leaf.role, flags)[leaf.key] = data
        rewards, term, trunc = flags["rewards"], flags["terminations"], flags["truncations"]
        t = int(rewards.shape[0])
        checked = [(leaf.path.decode(), arr) for leaf, arr in actions]
        for key, arr in (*checked, ("terminations", term), ("truncations", trunc)):
            if arr.shape[0] != t:
                raise SourceFormatError(
                    f"{label}: {key!r} has {arr.shape[0]} rows, 'rewards' has {t} (ragged)"
                )
        for key, arr in obs.items():
            if arr.shape[0] != t + 1:
                raise SourceFormatError(
                    f"{label}: {key!r} has {arr.shape[0]} rows, expected {t + 1} (T+1 observations for "
                    f"{t} steps)"
                )
        steps["next/reward"] = _column(rewards)
        for key, arr in infos.items():
            if arr.ndim and arr.shape[0] == t + 1:
                obs[key] = arr
            elif arr.ndim and arr.shape[0] == t:
                steps[key] = arr
            else:
                raise SourceFormatError(
                    f"{label}: infos {key[5:]!r} has {arr.shape[0] if arr.ndim else 0} rows; expected "
                    f"{t + 1} (recorded at reset and every step) or {t}"
                )
        term_b = term.reshape(t) != 0
        trunc_b = trunc.reshape(t) != 0
        early = np.flatnonzero((term_b | trunc_b)[:-1])
        if len(early):
            raise SourceFormatError(
                f"{label}: step {int(early[0])} is flagged terminated/truncated before the episode's last "
                f"step {t - 1}"
            )
        terminated = bool(term_b[-1]) if t else False
        truncated = bool(trunc_b[-1]) if t else False
        if t and not (terminated or truncated):
            self._unflagged += 1
            truncated = True
        self._record_seed(self._index[i], seed, label)
        return Episode(label, obs, steps, terminated, source_id=i, truncated=truncated)

    def _record_seed(self, j: int, raw: Any, label: str) -> None:
        if raw is None:
            return
        value = as_seed(raw)
        if value is None:
            self._bad_seeds.append(f"{label}: {to_jsonable(raw)!r}")
            return
        self._seeds[j] = value
        self._seed_present[j] = True

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield the dataset as blocks of whole episodes, in episode-id order."""
        packer = BlockPacker(admit=EpisodeSchema(self.report))
        # uint64 holds every seed minari can write; absent ones are 0 with present False
        self._seeds = np.zeros(len(self.episode_ids), np.uint64)
        self._seed_present = np.zeros(len(self.episode_ids), bool)
        self._bad_seeds: list[str] = []
        self._index = {i: j for j, i in enumerate(self.episode_ids)}
        self._unflagged = 0
        for i in self.episode_ids:
            ep = self._episode(i)
            yield from packer.add(ep)
            if progress is not None:
                progress(ep.length)
        yield from packer.finish()
        if self._unflagged:
            self.report.notes.append(
                f"{self._unflagged} episode(s) end with neither terminations nor truncations set; "
                "their last step is marked truncated"
            )
        if self._bad_seeds:
            self.report.notes.append(
                f"{len(self._bad_seeds)} episode seed(s) are not integers in [0, 2**64 - 1] and are kept "
                f"as absent (minari/episode_seed_present false); first: {self._bad_seeds[0]}"
            )
