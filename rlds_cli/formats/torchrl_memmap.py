"""TorchRL / tensordict memmap directories (``TensorDict.memmap`` output, TED layout).

Such a directory holds a ``meta.json`` per TensorDict level and one raw ``<key>.memmap`` per
tensor (shape and dtype in ``meta.json``). This reader imports the TED data back (for example
what ``rlds export --to torchrl`` or a TorchRL replay buffer wrote):

* keys present at the root and under ``next/`` (``observation``, ``pixels``, ...) are
  observation-like: stored once, the final observation of an episode taken from ``next/``;
* ``next/reward``, ``next/terminated``, ``next/truncated`` become the TED step columns
  (``next/done`` alone, without the other two, is read as ``terminated``);
* root ``done``/``terminated``/``truncated`` (false after a reset), ``episode`` and ``index`` are
  recomputed by rlds and not imported; other root keys (``action``, ``info/...``) are step keys;
* an episode ends where ``next/done`` is true, where ``episode`` changes, and where
  ``next/observation[t] != observation[t+1]`` (counted as inferred, like D4RL resets).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError, SourceNotFoundError
from rlds_cli.formats.base import ConversionReport, ReaderBase, StepBlock

_FLAGS = ("done", "terminated", "truncated")
_SKIP_ROOT = {*_FLAGS, "episode", "index", "_weight"}
BLOCK_ROWS = 1 << 16


def _decode(part: str) -> str:
    import urllib.parse

    return urllib.parse.unquote(part)


def is_tensordict_memmap(path: Path) -> bool:
    """Whether ``path`` is a directory written by ``TensorDict.memmap``."""
    meta = path / "meta.json"
    if not meta.is_file():
        return False
    try:
        return "TensorDict" in str(json.loads(meta.read_text()).get("_type", ""))
    except (OSError, ValueError):
        return False


class TorchRLMemmapReader(ReaderBase):
    """Streams a tensordict memmap directory in TED layout as :class:`StepBlock` s."""

    format_name = "torchrl"

    def __init__(self, path: str | Path, *, block_rows: int = BLOCK_ROWS, **_: Any) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise SourceNotFoundError(f"source {self.path} does not exist")
        if not is_tensordict_memmap(self.path):
            raise SourceFormatError(
                f"{self.path} is not a tensordict memmap directory (no TensorDict meta.json)"
            )
        self.block_rows = block_rows
        self.report = ConversionReport(rules="torchrl-memmap-v1")
        self.tensors: dict[str, np.ndarray] = {}
        self._walk(self.path, "")
        lengths = {k: len(v) for k, v in self.tensors.items()}
        self.n = lengths.get("next/reward", 0)
        bad = [k for k, length in lengths.items() if length != self.n]
        if "next/reward" not in self.tensors or bad:
            raise SourceFormatError(
                f"{self.path}: TED data needs next/reward and equal lengths for every tensor"
                + (f" ({bad[0]!r} has {lengths[bad[0]]} rows, next/reward {self.n})" if bad else "")
            )
        self.flat = [
            k
            for k in self.tensors
            if not k.startswith("next/") and f"next/{k}" in self.tensors and k not in _SKIP_ROOT
        ]
        if not self.flat:
            raise SourceFormatError(f"{self.path}: no key is present both at the root and under next/")
        self.report.source_rows = self.n

    def _walk(self, directory: Path, prefix: str) -> None:
        try:
            meta = json.loads((directory / "meta.json").read_text())
        except (OSError, ValueError) as exc:
            raise SourceFormatError(f"{directory / 'meta.json'} is unreadable: {exc}") from exc
        for key, entry in meta.items():
            if not isinstance(entry, dict) or key in ("shape", "device", "_type"):
                continue
            name = prefix + _decode(key)
            if entry.get("type") == "TensorDict":
                self._walk(directory / key, name + "/")
            elif "dtype" in entry and not entry.get("is_nested"):
                dtype = np.dtype(str(entry["dtype"]).removeprefix("torch."))
                shape = tuple(int(s) for s in entry["shape"])
                file = directory / f"{key}.memmap"
                expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                if not file.is_file() or file.stat().st_size < expected:
                    raise SourceFormatError(f"{file} is missing or shorter than its meta.json says")
                self.tensors[name] = np.memmap(file, dtype=dtype, mode="r", shape=shape)

    def close(self) -> None:
        self.tensors.clear()

    def total_rows(self) -> int:
        return self.n

    def source_metadata(self) -> dict[str, Any]:
        return {"keys": sorted(self.tensors)}

    def source_arrays(self) -> dict[str, np.ndarray]:
        return {}

    def _flag(self, key: str, start: int, stop: int) -> np.ndarray:
        value = self.tensors.get(key)
        return (
            np.zeros(stop - start, bool) if value is None else np.asarray(value[start:stop]).reshape(-1) != 0
        )

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        t = self.tensors
        has_split = "next/terminated" in t or "next/truncated" in t
        for start in range(0, self.n, self.block_rows):
            stop = min(start + self.block_rows, self.n)
            look = min(stop + 1, self.n)
            term = self._flag("next/terminated" if has_split else "next/done", start, stop)
            trunc = self._flag("next/truncated", start, stop)
            end = term | trunc | self._flag("next/done", start, stop)
            # unflagged boundaries: the episode id changes, or next/obs is not the next row's obs
            jump = np.zeros(stop - start, bool)
            if "episode" in t:
                ep = np.asarray(t["episode"][start:look]).reshape(look - start, -1)[:, 0]
                jump[: len(ep) - 1] |= ep[1:] != ep[:-1]
            for key in self.flat:
                root = np.asarray(t[key][start + 1 : look])
                nxt = np.asarray(t[f"next/{key}"][start : look - 1])
                same = (root.reshape(len(root), -1) == nxt.reshape(len(nxt), -1)).all(axis=1)
                jump[: len(same)] |= ~same
            inferred = jump & ~end
            self.report.inferred_boundaries += int(inferred.sum())
            end |= inferred
            if stop == self.n:
                end[-1] = True
            trunc = trunc | (end & ~term)
            ends = np.flatnonzero(end)
            steps: dict[str, np.ndarray] = {
                "next/reward": np.asarray(t["next/reward"][start:stop]).reshape(stop - start, -1)[:, :1],
                "next/terminated": term[:, None],
                "next/truncated": trunc[:, None],
            }
            for key, value in t.items():
                if key in self.flat or key in _SKIP_ROOT or key.removeprefix("next/") in self.flat:
                    continue
                if key.startswith("next/") and key.removeprefix("next/") in (*_FLAGS, "reward"):
                    continue
                steps[key] = np.asarray(value[start:stop])
            if "action" not in steps:
                raise SourceFormatError(f"{self.path}: TED data needs an 'action' tensor")
            observations = {
                key: np.insert(
                    np.asarray(t[key][start:stop]),
                    ends + 1,
                    np.asarray(t[f"next/{key}"][start:stop])[ends],
                    axis=0,
                )
                for key in self.flat
            }
            yield StepBlock(steps=steps, observations=observations, ends=ends)
            if progress is not None:
                progress(stop - start)
