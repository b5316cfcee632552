"""Hostile sources through every reader, the way a user meets them: ``rlds download FILE``.

Each case is a source file made with the upstream library (h5py, numpy's ``savez``,
``TensorDict.memmap``, ``zipfile``/``tarfile``) the way an attacker (or a broken tool) would
make it: names with ``..``, absolute names, ``%2F`` in tensordict keys, HDF5 external and soft
links, external raw storage, virtual datasets, hard-link cycles, archive bombs of every archive
type, huge declared shapes (sparse HDF5 datasets, gzip of zeros, ``.npy`` headers that lie),
string, structured and 0-d step arrays. For every case the test asserts:

* the outcome: refused with one ``error:`` line (exit 1, no traceback, never "unexpected"),
  or, for source names that the documented key cleaner turns into valid keys, converted with
  every key valid and the rename listed in the notes;
* no file was written or changed anywhere outside the cache root (the cache root sits deep
  inside a sentinel tree, so a path with enough ``..`` would land in it);
* a refused source published nothing and left no build or unpacked directory behind.

The rules are written out in ``docs/formats.md`` ("Untrusted input").
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.formats.base import ConversionReport, Reader, StepBlock, is_valid_key
from tests.atari_dqn_fixtures import STORE_PREFIX, file_name, write_run
from tests.dataset_fixtures import rewrite_manifest
from tests.formats_fixtures import (
    golden_roboset,
    minari_episode,
    ogbench_arrays,
    write_amago,
    write_minari_by_hand,
)
from tests.gen_dgrl_fixtures import members_of, npy_bytes, npz_bytes, procgen_trajectory, write_tar
from tests.rlds_tfrecord_fixtures import write_rlds_dataset
from tests.vd4rl_fixtures import dreamer_episode, drqbc_arrays, save_episode, write_drqbc

runner = CliRunner()
N = 6  # rows of the small D4RL files

# ----------------------------------------------------------------------------- writers


def _npy(value: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, value, allow_pickle=False)
    return buf.getvalue()


def _lying_npy(shape: tuple[int, ...], dtype: str = "<f4") -> bytes:
    """An ``.npy`` whose header declares ``shape`` but holds 64 bytes of data."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue() + bytes(64)


def _npz(path: Path, arrays: dict[str, np.ndarray], raw: dict[str, bytes] | None = None) -> Path:
    """An ``.npz`` as ``np.savez`` writes it (stored members), plus raw members (deflated)."""
    with zipfile.ZipFile(path, "w") as z:
        for key, value in arrays.items():
            z.writestr(f"{key}.npy", _npy(value))
        for name, data in (raw or {}).items():
            z.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED)
    return path


def _d4rl_arrays() -> dict[str, np.ndarray]:
    timeouts = np.zeros(N, bool)
    timeouts[-1] = True
    return {
        "observations": np.arange(2 * N, dtype=np.float32).reshape(N, 2),
        "actions": np.zeros((N, 1), np.float32),
        "rewards": np.ones(N, np.float32),
        "terminals": np.zeros(N, bool),
        "timeouts": timeouts,
    }


def _d4rl(path: Path, edit: Callable[[h5py.File], None] | None = None, **replace: Any) -> Path:
    """A D4RL file as h5py writes it; ``replace`` swaps root datasets, ``edit`` adds the rest."""
    with h5py.File(path, "w") as f:
        for key, value in {**_d4rl_arrays(), **replace}.items():
            if value is not None:
                f.create_dataset(key, data=value)
        if edit is not None:
            edit(f)
    return path


def _replace_with(f: h5py.Group, name: str, how: str, tmp: Path) -> None:
    """Replace dataset ``name`` by a link or a dataset whose data lives in another local file
    (the file an attacker wants copied into the cache)."""
    shape, dtype = f[name].shape, f[name].dtype
    secret = np.full(shape, 7, dtype)
    with h5py.File(tmp / "secret.hdf5", "w") as other:
        other["x"] = secret
    (tmp / "secret.bin").write_bytes(secret.tobytes())
    del f[name]
    if how == "external-link":
        f[name] = h5py.ExternalLink(str(tmp / "secret.hdf5"), "/x")
    elif how == "soft-link":
        f.create_dataset(name + "_real", data=np.zeros(shape, dtype))
        f[name] = h5py.SoftLink(f"{f.name.rstrip('/')}/{name}_real")
    elif how == "external-storage":
        f.create_dataset(
            name, shape=shape, dtype=dtype, external=[(str(tmp / "secret.bin"), 0, secret.nbytes)]
        )
    elif how == "virtual":
        layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
        layout[:] = h5py.VirtualSource(str(tmp / "secret.hdf5"), "x", shape=shape)
        f.create_virtual_dataset(name, layout)
    else:  # pragma: no cover - a typo in a case
        raise ValueError(how)


def _swap(g: h5py.Group, name: str, make: Callable[[np.ndarray], Any]) -> None:
    """Replace dataset ``name`` by ``make(its data)``."""
    old = g[name][()]
    del g[name]
    g.create_dataset(name, data=make(old))


def _virtual_bomb(f: h5py.File) -> None:
    """A same-file virtual ``observations`` of 8 GiB mapping 48 bytes (the rest is fill value)."""
    small = f.create_dataset("virtual/0/observations", data=np.zeros((N, 2), np.float32))
    del f["observations"]
    layout = h5py.VirtualLayout(shape=(1 << 21, 1024), dtype="f4")
    layout[:N, :2] = h5py.VirtualSource(small)
    f.create_virtual_dataset("observations", layout, fillvalue=0)


def _blosc_observations(f: h5py.File) -> None:
    """``observations`` chunked with HDF5 filter 32001 (blosc), which plain h5py cannot apply."""
    shape = f["observations"].shape
    del f["observations"]
    plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    plist.set_chunk(shape)
    plist.set_filter(32001, h5py.h5z.FLAG_OPTIONAL, (2, 2, 4, 0, 5, 1, 1))
    made = h5py.h5d.create(
        f.id, b"observations", h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple(shape), dcpl=plist
    )
    made.write_direct_chunk((0,) * len(shape), b"not blosc bytes", filter_mask=0)


def _virtual_of(f: h5py.File, sources: dict[str, str]) -> None:
    """Each dataset ``name`` of ``sources`` (made a copy of its source when missing) made a
    same-file virtual dataset of ``sources[name]``."""
    for name in sources:
        if name not in f:
            f[name] = f[sources[name]][()]
    shapes = {name: (f[name].shape, f[name].dtype) for name in sources}
    for name in sources:
        del f[name]
    for name, source in sources.items():
        shape, dtype = shapes[name]
        layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
        layout[:] = h5py.VirtualSource(".", source, shape=shape, dtype=dtype)
        f.create_virtual_dataset(name, layout, fillvalue=0)


def _sparse(f: h5py.Group, name: str, rows: int, row: tuple[int, ...] = (1024,)) -> None:
    """A chunked dataset of ``rows`` rows whose chunks were never written (all fill value)."""
    f.create_dataset(name, shape=(rows, *row), dtype="f4", chunks=(64, *row))


def _gzip_bomb(f: h5py.File, name: str, nbytes: int) -> None:
    """A gzip dataset of ``nbytes`` zero bytes in one chunk, written pre-compressed."""
    rows = nbytes // 4
    d = f.create_dataset(name, shape=(rows,), dtype="f4", chunks=(rows,), compression="gzip")
    d.id.write_direct_chunk((0,), zlib.compress(bytes(nbytes), 9))


def _minari(tmp: Path, edit: Callable[[h5py.Group], None], **meta: Any) -> Path:
    src = write_minari_by_hand(tmp / "minari", [minari_episode(3), minari_episode(2)], metadata=meta or None)
    with h5py.File(src / "data" / "main_data.hdf5", "a") as f:
        edit(f["episode_0"])
    return src


def _roboset(tmp: Path, edit: Callable[[h5py.Group], None]) -> Path:
    src = golden_roboset(tmp / "roboset")
    with h5py.File(src / "a_trace.h5", "a") as f:
        edit(f["Trial0"])
    return src


def _ogbench(path: Path, raw: dict[str, bytes] | None = None, **replace: np.ndarray | None) -> Path:
    """An OGBench file; a ``None`` replacement leaves the array out (``raw`` then adds it)."""
    arrays = {k: v for k, v in {**ogbench_arrays([3, 4, 8], 9), **replace}.items() if v is not None}
    return _npz(path, arrays, raw)


def _amago(tmp: Path, **replace: Any) -> Path:
    src = write_amago(tmp / "amago", [(4, True), (3, False)])
    first = sorted((src / "buffer" / "fifo").iterdir())[0]
    arrays = dict(np.load(first))
    raw = {k: v for k, v in replace.items() if isinstance(v, bytes)}
    arrays.update({k: v for k, v in replace.items() if not isinstance(v, bytes)})
    for name in raw:
        arrays.pop(name.removesuffix(".npy"), None)
    _npz(first, arrays, raw)
    return src


def _torchrl(tmp: Path, edit: Callable[[Path, dict[str, Any]], None]) -> Path:
    torch = pytest.importorskip("torch")
    tensordict = pytest.importorskip("tensordict")
    n = 5
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[-1] = True
    td = tensordict.TensorDict(
        {
            "observation": torch.arange(2 * n, dtype=torch.float32).reshape(n, 2),
            "action": torch.zeros(n, 1),
            "next": {
                "observation": torch.arange(2, 2 * n + 2, dtype=torch.float32).reshape(n, 2),
                "reward": torch.zeros(n, 1),
                "done": done,
            },
        },
        batch_size=[n],
    )
    out = tmp / "td"
    td.memmap(out)
    meta = json.loads((out / "meta.json").read_text())
    edit(out, meta)
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def _add_tensor(out: Path, meta: dict[str, Any], key: str, file_name: str) -> None:
    """A tensor ``key`` (a copy of ``action``) whose memmap file is ``file_name``."""
    meta[key] = dict(meta["action"])
    shutil.copy(out / "action.memmap", out / file_name)


def _tar(path: Path, members: dict[str, bytes], mode: str) -> Path:
    with tarfile.open(path, mode) as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


# ----------------------------------------------------------------------------- the cases


@dataclass
class Case:
    """A hostile source and what must happen to it.

    Attributes:
        path: The source.
        match: A piece of the error line (refused) or of the conversion notes (cleaned).
        refused: Whether it must be refused; else it converts with cleaned keys.
        fmt: ``--format`` to pass (``None``: detected).
        env: Environment for the command.
        floors: Lower the size floors of the bomb rules to this many bytes (keeps bombs small).
    """

    path: Path
    match: str
    refused: bool = True
    fmt: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    floors: int | None = None


_UNSAFE = "rlds reads only data stored in the file itself"
_NUMERIC = "rlds stores numeric arrays only"
_BOMB = "a decompression bomb or a sparse dataset"
_ARCHIVE_BOMB = "a decompression bomb?"
MIB = 1 << 20


def _cases() -> dict[str, Callable[[Path], Case]]:
    c: dict[str, Callable[[Path], Case]] = {}
    # -- names that would be paths: cleaned by the one key cleaner (docs/formats.md, "Key names")
    c["ogbench-member-dotdot"] = lambda t: Case(
        _ogbench(t / "og.npz", {"../../../../../X.npy": _npy(np.zeros((9, 1), np.float32))}),
        "-> 'info/__/__/__/__/__/X'",
        refused=False,
    )
    c["ogbench-member-absolute"] = lambda t: Case(
        _ogbench(t / "og.npz", {"/abs/X.npy": _npy(np.zeros((9, 1), np.float32))}),
        "-> 'info/_/abs/X'",
        refused=False,
    )
    c["d4rl-group-dotdot"] = lambda t: Case(
        _d4rl(t / "d.hdf5", lambda f: f.create_dataset("infos/../../../../X", data=np.zeros(N))),
        "-> 'info/__/__/__/__/X'",
        refused=False,
    )
    c["minari-group-dotdot"] = lambda t: Case(
        _minari_all(t, lambda g: g.create_dataset("infos/../../../X", data=np.zeros(len(g["observations"])))),
        "-> 'info/__/__/__/X'",
        refused=False,
    )
    c["amago-obs-key-dotdot"] = lambda t: Case(
        write_amago(t / "amago", [(4, True)], obs_keys=("../../../../X", "observation")),
        "-> 'observation/__/__/__/__/X'",
        refused=False,
    )
    c["roboset-env-infos-dotdot"] = lambda t: Case(
        _roboset_all(t, lambda g: g.create_dataset("env_infos/../../../X", data=np.zeros(g["time"].shape))),
        "-> 'info/__/__/__/X'",
        refused=False,
    )
    c["torchrl-key-escaped-slash"] = lambda t: Case(
        _torchrl(
            t, lambda out, meta: _add_tensor(out, meta, "..%2F..%2F..%2FX", "..%252F..%252F..%252FX.memmap")
        ),
        "-> '.._2F.._2F.._2FX'",
        refused=False,
    )
    c["torchrl-key-slash"] = lambda t: Case(
        _torchrl(t, lambda out, meta: _add_tensor(out, meta, "../../../X", "..%2F..%2F..%2FX.memmap")),
        "-> '.._.._.._X'",  # a tensordict key is one name: '/' inside it is cleaned too
        refused=False,
    )
    c["torchrl-key-nul"] = lambda t: Case(
        _torchrl(t, lambda out, meta: meta.__setitem__("a\0b", dict(meta["action"]))),
        "a%00b.memmap is missing or shorter than its meta.json says",
    )
    c["d4rl-key-too-long"] = lambda t: Case(
        _d4rl(t / "d.hdf5", lambda f: f.create_dataset("infos/" + "k" * 250, data=np.zeros(N))),
        "is 250 characters long",
    )
    # -- links and storage outside the file
    for how in ("external-link", "soft-link", "external-storage", "virtual"):
        c[f"d4rl-{how}"] = lambda t, how=how: Case(
            _d4rl(t / "d.hdf5", lambda f: _replace_with(f, "observations", how, t)), _UNSAFE
        )
        c[f"minari-{how}"] = lambda t, how=how: Case(
            _minari(t, lambda g: _replace_with(g, "observations", how, t)), _UNSAFE
        )
        c[f"roboset-{how}"] = lambda t, how=how: Case(
            _roboset(t, lambda g: _replace_with(g, "observations", how, t)), _UNSAFE
        )
    c["d4rl-virtual-mostly-fill"] = lambda t: Case(_d4rl(t / "d.hdf5", _virtual_bomb), _BOMB)
    # a filter h5py lacks (blosc, as hdf5plugin writes it): blamed on a corrupt download
    c["d4rl-filter-not-installed"] = lambda t: Case(
        _d4rl(t / "d.hdf5", _blosc_observations),
        "'observations' is compressed with HDF5 filter 32001 (unnamed), which is not installed",
    )
    # HDF5 follows a mapping of itself until the process dies (SIGSEGV, no line at all)
    c["d4rl-virtual-maps-itself"] = lambda t: Case(
        _d4rl(t / "d.hdf5", lambda f: _virtual_of(f, {"observations": "observations"})),
        "'observations' is a virtual dataset mapping itself (a cycle)",
    )
    c["d4rl-virtual-chain"] = lambda t: Case(
        _d4rl(t / "d.hdf5", lambda f: _virtual_of(f, {"observations": "next_observations",
                                                      "next_observations": "observations"})),
        "is a virtual dataset mapping 'observations', itself virtual (a chain may cycle)",
    )  # fmt: skip
    c["d4rl-hard-link-cycle"] = lambda t: Case(
        _d4rl(t / "d.hdf5", lambda f: f.create_group("infos").__setitem__("loop", f["infos"])),
        "(linked twice: a cycle?)",
    )
    c["minari-hard-link-cycle"] = lambda t: Case(
        _minari(t, lambda g: g.__setitem__("infos", g)), "(linked twice: a cycle?)"
    )
    # -- huge declared shapes
    c["d4rl-sparse-observations"] = lambda t: Case(
        _d4rl(t / "d.hdf5", lambda f: (f.__delitem__("observations"), _sparse(f, "observations", 1 << 21))),
        _BOMB,
    )
    c["d4rl-sparse-side-array"] = lambda t: Case(
        _d4rl(t / "d.hdf5", lambda f: _sparse(f, "metadata/huge", 1 << 21)), _BOMB
    )
    c["d4rl-gzip-bomb-info"] = lambda t: Case(
        _d4rl(t / "d.hdf5", lambda f: _gzip_bomb(f, "infos/zeros", 8 * MIB)), _BOMB, floors=MIB
    )
    c["d4rl-side-array-over-cap"] = lambda t: Case(
        _d4rl(t / "d.hdf5", lambda f: f.create_dataset("metadata/big", data=np.ones(1 << 19, np.float32))),
        "over the limit of 1,048,576 for arrays read whole",
        env={"RLDS_SIDE_ARRAY_MAX_BYTES": str(MIB)},
    )
    c["d4rl-npz-lying-header"] = lambda t: Case(
        _npz(t / "d.npz", _d4rl_arrays(), {"infos/big.npy": _lying_npy((N, 1 << 30))}),
        "declares 25,769,803,776 bytes",
        fmt="d4rl",
    )
    c["d4rl-npz-deflate-bomb"] = lambda t: Case(
        _npz(t / "d.npz", _d4rl_arrays(), {"infos/zeros.npy": _npy(np.zeros((N, 2 * MIB // N), np.float32))}),
        _BOMB,
        fmt="d4rl",
        floors=MIB,
    )
    c["minari-sparse"] = lambda t: Case(
        _minari(t, lambda g: (g.__delitem__("rewards"), _sparse(g, "rewards", 1 << 21))), _BOMB
    )
    c["roboset-sparse"] = lambda t: Case(
        _roboset(t, lambda g: (g.__delitem__("rewards"), _sparse(g, "rewards", 1 << 21))), _BOMB
    )
    c["ogbench-lying-header"] = lambda t: Case(
        _ogbench(t / "og.npz", {"terminals.npy": _lying_npy((1 << 40,), "|b1")}, terminals=None),
        "declares 1,099,511,627,776 bytes",
    )
    c["ogbench-deflate-bomb"] = lambda t: Case(
        _ogbench(t / "og.npz", {"qvel.npy": _npy(np.zeros((9, 2 * MIB // 9), np.float32))}, qvel=None),
        _BOMB,
        floors=MIB,
    )
    c["amago-lying-header"] = lambda t: Case(
        _amago(t, **{"rews.npy": _lying_npy((1 << 40, 1))}), "declares 4,398,046,511,104 bytes"
    )
    c["torchrl-huge-shape"] = lambda t: Case(
        _torchrl(t, lambda out, meta: meta["action"].update(shape=[5, 1 << 40, 1 << 40])),
        "missing or shorter than its meta.json says",
    )
    c["torchrl-negative-shape"] = lambda t: Case(
        _torchrl(t, lambda out, meta: meta["action"].update(shape=[5, -1])), "not a list of sizes >= 0"
    )
    # -- step arrays that are not numbers
    for key in ("observations", "actions", "rewards", "terminals"):
        c[f"d4rl-string-{key}"] = lambda t, key=key: Case(
            _d4rl(t / "d.hdf5", **{key: np.array([b"1"] * N)}), f"'{key}' holds fixed-width byte strings"
        )
    c["d4rl-structured-observations"] = lambda t: Case(
        _d4rl(t / "d.hdf5", observations=np.zeros(N, [("x", "f4"), ("y", "i4")])), "structured (compound)"
    )
    c["d4rl-0d-observations"] = lambda t: Case(
        _d4rl(t / "d.hdf5", observations=np.float32(1)), "is a single value (0-d)"
    )
    c["d4rl-npz-string-observations"] = lambda t: Case(
        _npz(t / "d.npz", {**_d4rl_arrays(), "observations": np.array(["a"] * N)}),
        "fixed-width unicode strings",
        fmt="d4rl",
    )
    c["ogbench-string-actions"] = lambda t: Case(
        _ogbench(t / "og.npz", actions=np.array(["x"] * 9)), "'actions' holds fixed-width unicode strings"
    )
    c["ogbench-structured-observations"] = lambda t: Case(
        _ogbench(t / "og.npz", observations=np.zeros(9, [("a", "f4")])), "structured (compound)"
    )
    c["ogbench-void-info"] = lambda t: Case(
        _ogbench(t / "og.npz", qpos=np.zeros(9, "V4")), "'qpos' holds opaque (void) bytes"
    )
    c["amago-string-actions"] = lambda t: Case(
        _amago(t, actions=np.array([b"a"] * 3)), "'actions' holds fixed-width byte strings"
    )
    c["roboset-string-observations"] = lambda t: Case(
        _roboset(
            t, lambda g: (g.__delitem__("observations"), g.create_dataset("observations", data=[b"x"] * 4))
        ),
        "'observations' holds variable-length strings",
    )
    c["minari-string-rewards"] = lambda t: Case(
        _minari(t, lambda g: (g.__delitem__("rewards"), g.create_dataset("rewards", data=[b"1"] * 3))),
        "'rewards' holds text",
    )
    c["minari-structured-observations"] = lambda t: Case(
        _minari_all(t, lambda g: _swap(g, "observations", lambda old: np.zeros(len(old), "f4,f4"))),
        "structured (compound)",
    )
    c["minari-0d-rewards"] = lambda t: Case(
        _minari(t, lambda g: (g.__delitem__("rewards"), g.create_dataset("rewards", data=1.0))),
        "is a single value (0-d)",
    )
    c["minari-non-json-space"] = lambda t: Case(
        _minari(t, lambda g: None, observation_space="Box(not json"),
        "'observation_space' is not a JSON object",
    )
    c["torchrl-string-dtype"] = lambda t: Case(
        _torchrl(t, lambda out, meta: meta["action"].update(dtype="torch.S4")), "fixed-width byte strings"
    )
    c["torchrl-unknown-dtype"] = lambda t: Case(
        _torchrl(t, lambda out, meta: meta["action"].update(dtype="torch.float128x")),
        "which numpy cannot hold",
    )
    # -- LeRobot: path templates that leave the dataset, links out of it, names that would be paths
    c["lerobot-template-dotdot"] = lambda t: Case(
        _lerobot(t, lambda info: info.update(data_path="../../{chunk_index}/{file_index}.parquet")),
        "escapes the dataset directory",
    )
    c["lerobot-template-absolute"] = lambda t: Case(
        _lerobot(t, lambda info: info.update(video_path="/etc/{video_key}.mp4")),
        "escapes the dataset directory",
    )
    c["lerobot-template-attribute"] = lambda t: Case(
        _lerobot(t, lambda info: info.update(data_path="{chunk_index.__class__.__mro__}")), "uses the field"
    )
    c["lerobot-symlink-out"] = lambda t: Case(_lerobot_symlink(t), "escapes the dataset directory")
    c["lerobot-feature-dotdot"] = lambda t: Case(
        _lerobot(t, lambda info: None, rename={"observation.state": "observation.../../../../X"}),
        "-> 'observation/_/_/_/_/_/_/_/_/_X'",
        refused=False,
    )
    c["lerobot-string-action"] = lambda t: Case(
        _lerobot(t, lambda info: None, retype={"action": ["a", "b"]}), "holds string values"
    )
    # -- the pixel sources: names from the source, links, lying headers, damaged framing
    c["rlds-tfrecord-feature-dotdot"] = lambda t: Case(
        write_rlds_dataset(t / "oxe", (3, 2), side=8, state_name="../../../../X").root,
        "'steps/observation/../../../../X' -> 'observation/",
        refused=False,
    )
    c["rlds-tfrecord-crc"] = lambda t: Case(_flip_byte(write_rlds_dataset(t / "oxe", (3, 2), side=8)), "CRC")
    c["vd4rl-npz-key-dotdot"] = lambda t: Case(
        _vd4rl_npz(t, {"../../../../X": np.zeros(9, np.float32)}),
        "'../../../../X' -> 'observation/",
        refused=False,
    )
    c["vd4rl-npz-string-array"] = lambda t: Case(
        _vd4rl_npz(t, {"label": np.array(["a"] * 9)}), "label: text values are not stored", refused=False
    )
    c["vd4rl-hdf5-external-link"] = lambda t: Case(_vd4rl_hdf5(t, "external-link"), _UNSAFE)
    c["vd4rl-hdf5-virtual"] = lambda t: Case(_vd4rl_hdf5(t, "virtual"), _UNSAFE)
    c["atari-dqn-lying-header"] = lambda t: Case(
        _atari(
            t,
            lambda logs: _gzip_to(
                logs / file_name(STORE_PREFIX + "observation", 0), _lying_npy((1 << 40, 84, 84), "|u1")
            ),
        ),
        # (the trailer of a multi-member file holds its last member's length: a larger header is
        # left to the size check, which refuses it before anything is read)
        "'observation' declares 7,758,154,045,587,456 bytes but the file compresses into only",
    )
    c["atari-dqn-pickled-array"] = lambda t: Case(
        _atari(
            t,
            lambda logs: _gzip_to(
                logs / file_name("add_count", 0), npy_bytes(np.array([{"x": 1}], dtype=object))
            ),
        ),
        file_name("add_count", 0),
    )
    c["gen-dgrl-member-dotdot"] = lambda t: Case(
        _gen_dgrl(t, extra=[("../../../../X.npz", npz_bytes({"x": np.zeros(3)}))]), "escapes the archive"
    )
    c["gen-dgrl-key-dotdot"] = lambda t: Case(
        _gen_dgrl(t, add={"../../../../X": np.zeros(3, np.float32)}),
        "keys other than observations, actions, rewards and dones are not stored: ['../../../../X']",
        refused=False,
    )
    c["gen-dgrl-pickled-callable"] = lambda t: Case(
        _gen_dgrl(t, extra=[("g/evil.npy", npy_bytes({"x": os.system}))]), "asks for"
    )
    # -- archives: bombs of every type, and empty ones
    zeros = {"data/big.npz": bytes(8 * MIB)}
    for suffix, mode in ((".tar.gz", "w:gz"), (".tar.bz2", "w:bz2"), (".tar.xz", "w:xz")):
        c[f"archive-bomb{suffix}"] = lambda t, suffix=suffix, mode=mode: Case(
            _tar(t / f"bomb{suffix}", zeros, mode), _ARCHIVE_BOMB, fmt="ogbench", floors=MIB
        )
    c["archive-bomb.zip"] = lambda t: Case(_zip(t / "bomb.zip", zeros), "bomb?", fmt="ogbench", floors=MIB)
    c["archive-bzip2-member.zip"] = lambda t: Case(
        _zip(t / "b.zip", {"a.npz": b"x" * 100}, zipfile.ZIP_BZIP2), "uses compression method 12"
    )
    c["archive-over-total.tar"] = lambda t: Case(
        _tar(t / "big.tar", {"a.npz": bytes(2 * MIB)}, "w"),
        "unpacks to more than 1,048,576 bytes",
        env={"RLDS_ARCHIVE_MAX_BYTES": str(MIB)},
    )
    c["archive-only-a-folder.zip"] = lambda t: Case(_zip(t / "f.zip", {"folder/": b""}), "holds no files")
    c["archive-holding-external-link.tar.gz"] = lambda t: Case(
        _tar_of(t, _d4rl(t / "d.hdf5", lambda f: _replace_with(f, "observations", "external-link", t))),
        _UNSAFE,
    )
    return c


def _flip_byte(fx: Any) -> Path:
    """Flip one byte in the middle of the first shard's second record (its data CRC fails)."""
    shard = fx.shards[0]
    data = bytearray(shard.read_bytes())
    data[len(data) * 3 // 4] ^= 0xFF
    shard.write_bytes(bytes(data))
    return Path(fx.root)


def _vd4rl_npz(t: Path, extra: dict[str, np.ndarray]) -> Path:
    """One Dreamer episode file (8 steps) with ``extra`` arrays, under V-D4RL's folder names."""
    episode = {**dreamer_episode(9, side=8), **extra}
    return save_episode(
        t / "vd4rl" / "main" / "walker_walk" / "medium" / "64px" / "20220109T010000-x-9.npz", episode
    ).parent


def _vd4rl_hdf5(t: Path, how: str) -> Path:
    path = write_drqbc(t / "walker_walk_medium.hdf5", drqbc_arrays([dreamer_episode(9, side=8)]))
    with h5py.File(path, "a") as f:
        _replace_with(f, "observation", how, t)
    return path


def _gzip_to(path: Path, payload: bytes) -> None:
    with gzip.open(path, "wb") as f:
        f.write(payload)


def _atari(t: Path, edit: Callable[[Path], None]) -> Path:
    logs = t / "Pong" / "1" / "replay_logs"
    write_run(logs, capacity=40, episode_lengths=[7, 9, 5], obs_shape=(8, 8))
    edit(logs)
    return logs


def _gen_dgrl(
    t: Path, extra: list[tuple[str, bytes]] | None = None, add: dict[str, np.ndarray] | None = None
) -> Path:
    """A ``bigfish.tar.xz`` of two trajectories (one npz, one pickled dict), plus ``extra``
    members; ``add``: more arrays in every trajectory."""
    rng = np.random.default_rng(0)
    trajectories = [procgen_trajectory(rng, 6 + i, index=i, side=8) for i in range(2)]
    for traj in trajectories:
        traj.arrays.update(add or {})
    return write_tar(t / "bigfish.tar.xz", [*members_of(trajectories, game="g"), *(extra or [])])


def _zip(path: Path, members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", method) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _tar_of(t: Path, source: Path) -> Path:
    out = t / f"{source.name}.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        tf.add(source, arcname=source.name)
    source.unlink()
    return out


def _roboset_all(t: Path, edit: Callable[[h5py.Group], None]) -> Path:
    """Apply ``edit`` to every trial of every file (a key must exist in every episode)."""
    src = golden_roboset(t / "roboset")
    for path in sorted(src.iterdir()):
        with h5py.File(path, "a") as f:
            for name in f:
                edit(f[name])
    return src


def _minari_all(t: Path, edit: Callable[[h5py.Group], None]) -> Path:
    src = write_minari_by_hand(t / "minari", [minari_episode(3), minari_episode(2)])
    with h5py.File(src / "data" / "main_data.hdf5", "a") as f:
        for name in f:
            edit(f[name])
    return src


LEROBOT = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot-v3-tiny"
LEROBOT_DATA = Path("data/chunk-000/file-000.parquet")


def _lerobot(
    t: Path,
    edit: Callable[[dict[str, Any]], None],
    rename: dict[str, str] | None = None,
    retype: dict[str, list[str]] | None = None,
) -> Path:
    """The golden LeRobot tree (written by lerobot itself) with ``edit`` applied to its info.json,
    data columns renamed (in info.json too) or replaced by text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = t / "lerobot"
    shutil.copytree(LEROBOT, src)
    for p in src.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    info = json.loads((src / "meta" / "info.json").read_text())
    edit(info)
    table = pq.read_table(src / LEROBOT_DATA)
    for old, new in (rename or {}).items():
        table = table.rename_columns([new if n == old else n for n in table.column_names])
        info["features"] = {(new if k == old else k): v for k, v in info["features"].items()}
    for name, values in (retype or {}).items():
        column = pa.array([values] * table.num_rows, pa.list_(pa.string()))
        table = table.set_column(table.column_names.index(name), name, column)
    pq.write_table(table, src / LEROBOT_DATA)
    (src / "meta" / "info.json").write_text(json.dumps(info))
    return src


def _lerobot_symlink(t: Path) -> Path:
    src = _lerobot(t, lambda info: None)
    outside = t / "outside.parquet"
    shutil.move(src / LEROBOT_DATA, outside)
    (src / LEROBOT_DATA).symlink_to(outside)
    return src


CASES = _cases()


def _tree(root: Path, skip: Path) -> dict[str, tuple[int, int]]:
    """Every file below ``root`` but inside ``skip``: path -> (size, mtime)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == skip:
            dirnames[:] = []
            continue
        for name in filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_source(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "sentinel" / "a" / "b" / "c" / "d" / "home"
    (tmp_path / "sentinel" / "a" / "b" / "keep.txt").parent.mkdir(parents=True)
    (tmp_path / "sentinel" / "a" / "b" / "keep.txt").write_text("keep")
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    spec = CASES[case](src_dir)
    if spec.floors is not None:  # small bombs: the rules are the same, the floors lower
        monkeypatch.setattr("rlds_cli.formats.untrusted.RATIO_FLOOR_BYTES", spec.floors)
        monkeypatch.setattr("rlds_cli.formats.archives.RATIO_FLOOR_BYTES", spec.floors)
    before = _tree(tmp_path, home)
    args = ["download", str(spec.path), "--name", "hostile", "--root", str(home)]
    result = runner.invoke(app, [*args, *(["--format", spec.fmt] if spec.fmt else [])], env=spec.env)

    assert _tree(tmp_path, home) == before, "a file outside the cache root was written or changed"
    assert "unexpected" not in result.output and "Traceback" not in result.output, result.output
    if spec.refused:
        assert result.exit_code == 1, (result.output, result.exception)
        lines = result.stderr.splitlines()
        assert lines[0].startswith("error: ") and len(lines) <= 2, lines
        assert spec.match in lines[0], lines[0]
        for sub in ("datasets", "tmp"):  # nothing published, no build or unpacked copy left
            folder = home / sub
            assert not folder.exists() or list(folder.iterdir()) == [], (sub, list(folder.iterdir()))
    else:
        assert result.exit_code == 0, result.output
        ds = open_dataset("hostile", root=home)
        assert all(is_valid_key(key) for key in ds.manifest.fields)
        assert spec.match in "\n".join(ds.manifest.conversion["notes"])
        arrays = home / "datasets" / "hostile" / "arrays"
        assert all(p.resolve().is_relative_to(arrays.resolve()) for p in arrays.rglob("*"))


def test_the_fixture_set_covers_every_reader_and_attack() -> None:
    """Every reader (and archives) meets hostile keys, links or bombs, and non-numeric arrays."""
    names = set(CASES)
    readers = (
        "d4rl", "d4rl-npz", "minari", "roboset", "ogbench", "amago", "torchrl", "lerobot", "rlds-tfrecord",
        "vd4rl", "atari-dqn", "gen-dgrl", "archive",
    )  # fmt: skip
    for reader in readers:
        assert any(n.startswith(reader + "-") for n in names), reader
    for attack in ("dotdot", "absolute", "slash", "external-link", "external-storage", "virtual", "bomb"):
        assert any(attack in n for n in names), attack
    assert len(CASES) >= 55, len(CASES)


# ----------------------------------------------------------------------------- memory


def test_a_huge_declared_side_array_allocates_nothing(tmp_path: Path) -> None:
    """A 30 KB D4RL file declaring a 2 GiB side array (chunks never written): refused before
    anything is allocated (the process's peak memory stays far below the declared size)."""
    src = _d4rl(tmp_path / "d.hdf5", lambda f: _sparse(f, "metadata/huge", 1 << 19))
    assert src.stat().st_size < 64 * 1024
    code = textwrap.dedent(
        f"""
        import sys
        from rlds_cli.sources.convert import convert
        from rlds_cli.errors import RldsError
        try:
            convert({str(src)!r}, "huge", root={str(tmp_path / "home")!r})
        except RldsError as exc:
            print("REFUSED", exc.message)
        # VmHWM: this process's own peak (ru_maxrss would carry the forking parent's over exec)
        peak = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
        print("MAXRSS_KB", peak.split()[1])
        """
    )
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "REFUSED" in proc.stdout and "declares 2,147,483,648 bytes" in proc.stdout, proc.stdout
    maxrss_mb = int(proc.stdout.split("MAXRSS_KB")[1]) / 1024
    assert maxrss_mb < 600, f"peak memory {maxrss_mb:.0f} MB for a refused file"


# ----------------------------------------------------------------------------- one place for keys


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
@pytest.mark.parametrize("key", ["../../../../X", "/abs/X", "a//b", "a/./b", "a b", "k" * 201, ""])
def test_the_backend_refuses_keys_that_are_no_safe_path(tmp_path: Path, backend: str, key: str) -> None:
    """The backend's key-to-path function is the one place a key becomes a path: whatever a
    reader or a preprocessing function hands it, a key outside the grammar is refused before a
    file is opened, for writing and for reading."""
    from rlds_cli.cache.backends import get_backend
    from rlds_cli.errors import InvalidKeyError

    build = tmp_path / "sentinel" / "a" / "b" / "c" / "build"
    build.mkdir(parents=True)
    with pytest.raises(InvalidKeyError, match="cannot be a file name"):
        get_backend(backend).create_column(build, key, np.dtype("f4"), (2,))
    with pytest.raises(InvalidKeyError):
        get_backend(backend).open_column(build, key)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_reader_that_yields_a_path_as_a_key_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader bypassing the key cleaner (a bug, or a new format) cannot write outside the
    cache: the conversion stops with an error naming the source and the key."""
    from rlds_cli.errors import SourceFormatError
    from rlds_cli.sources.convert import convert

    monkeypatch.setitem(
        __import__("rlds_cli.formats", fromlist=["READERS"]).READERS, "evil", f"{__name__}:_EvilReader"
    )
    home = tmp_path / "sentinel" / "a" / "b" / "c" / "home"
    src = tmp_path / "evil.bin"
    src.write_bytes(b"x")
    with pytest.raises(SourceFormatError, match=r"evil\.bin: key '\.\./\.\./\.\./\.\./X' cannot be stored"):
        convert(src, "evil", format="evil", root=home)
    assert not list(tmp_path.rglob("X*"))
    assert not (home / "datasets").exists() or not list((home / "datasets").iterdir())


class _EvilReader(Reader):
    """A reader that hands the builder a key that is a path out of the dataset."""

    format_name = "evil"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.report = ConversionReport(rules="evil")

    def total_rows(self) -> int:
        return 2

    def blocks(self, progress: Any = None) -> Any:
        yield StepBlock(
            steps={
                "action": np.zeros((2, 1), np.float32),
                "next/reward": np.zeros((2, 1), np.float32),
                "next/terminated": np.array([[False], [True]]),
                "next/truncated": np.zeros((2, 1), bool),
                "../../../../X": np.zeros((2, 1), np.float32),
            },
            observations={"observation": np.zeros((3, 2), np.float32)},
            ends=np.array([1]),
        )

    def source_metadata(self) -> dict[str, Any]:
        return {}

    def source_arrays(self) -> dict[str, np.ndarray]:
        return {}


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_a_tampered_manifest_cannot_read_another_datasets_files(tmp_path: Path, backend: str) -> None:
    """Manifest keys are checked on read: a manifest whose key climbs out of the dataset
    ('../../other/arrays/observation') is damage, never a read of another dataset's files."""
    from rlds_cli.errors import CorruptDatasetError
    from rlds_cli.sources.convert import convert

    src = _d4rl(tmp_path / "d.hdf5")
    convert(src, "victim", root=tmp_path / "home", backend=backend)
    convert(src, "other", root=tmp_path / "home", backend=backend)
    manifest = tmp_path / "home" / "datasets" / "victim" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["fields"]["../../other/arrays/observation"] = data["fields"].pop("observation")
    manifest.write_text(json.dumps(data))
    rewrite_manifest(manifest)
    with pytest.raises(
        CorruptDatasetError, match=re.escape("names the array key '../../other/arrays/observation'")
    ):
        open_dataset("victim", root=tmp_path / "home")
    result = runner.invoke(app, ["inspect", "victim", "--root", str(tmp_path / "home")])
    assert result.exit_code == 1 and "no safe path" in result.stderr, result.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file: permission denied cannot happen")
@pytest.mark.parametrize("kind", ["d4rl", "ogbench", "archive"])
def test_an_unreadable_source_names_the_file(tmp_path: Path, kind: str) -> None:
    src = {
        "d4rl": lambda: _d4rl(tmp_path / "d.hdf5"),
        "ogbench": lambda: _ogbench(tmp_path / "og.npz"),
        "archive": lambda: _tar(tmp_path / "a.tar.gz", {"x.npz": b"x"}, "w:gz"),
    }[kind]()
    src.chmod(0)
    try:
        result = runner.invoke(app, ["download", str(src), "--name", "x", "--root", str(tmp_path / "home")])
    finally:
        src.chmod(0o644)
    assert result.exit_code == 1, result.output
    assert "permission denied" in result.stderr and str(src) in result.stderr, result.stderr
    assert "unexpected" not in result.output


def test_a_virtual_dataset_of_its_own_file_converts(tmp_path: Path) -> None:
    """D4RL's CARLA files are built as virtual datasets over gzip chunks of the same file
    (``virtual/<i>/<key>``, source file ``.``): those are read, equal to h5py's reading; a
    virtual dataset mapping any other file is refused (the ``d4rl-virtual`` case above)."""
    from rlds_cli.sources.convert import convert

    n = 40
    arrays = _d4rl_arrays()
    arrays["observations"] = np.random.default_rng(0).normal(size=(n, 3)).astype(np.float32)
    arrays["actions"] = np.arange(n, dtype=np.float32)[:, None]
    arrays["rewards"] = np.arange(n, dtype=np.float32)
    arrays["terminals"] = np.zeros(n, bool)
    arrays["timeouts"] = np.zeros(n, bool)
    arrays["timeouts"][[19, 39]] = True
    src = tmp_path / "carla.hdf5"
    with h5py.File(src, "w") as f:  # as d4rl's scripts/generation/carla merge script writes it
        for key, value in arrays.items():
            layout = h5py.VirtualLayout(shape=value.shape, dtype=value.dtype)
            for i, rows in enumerate((slice(0, 25), slice(25, n))):
                chunk = f.create_dataset(f"virtual/{i}/{key}", data=value[rows], compression="gzip")
                layout[rows] = h5py.VirtualSource(chunk)
            f.create_virtual_dataset(key, layout, fillvalue=0)
    ds = convert(src, "carla", root=tmp_path / "home")
    batch = open_dataset("carla", root=tmp_path / "home")[:]
    with h5py.File(src) as f:
        keep = np.flatnonzero(~f["timeouts"][()])  # a timeout row's next state is unknown: dropped
        for key, h5key in (
            ("observation", "observations"),
            ("action", "actions"),
            ("next/reward", "rewards"),
        ):
            want = f[h5key][()][keep]
            got = batch[key].reshape(want.shape)
            np.testing.assert_array_equal(got, want, err_msg=key)
            assert got.dtype == want.dtype, key
    assert ds.manifest.num_steps == n - 2


@pytest.mark.parametrize("kind", ["d4rl", "minari"])
def test_an_unreadable_file_fails_before_reading_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The same check as above where the test runs as root (who reads every file): every source
    file is opened once before anything else, and a refusal names the file."""
    from rlds_cli.errors import SourceNotReadableError

    src = _d4rl(tmp_path / "d.hdf5") if kind == "d4rl" else _minari(tmp_path, lambda g: None)
    locked = src if kind == "d4rl" else src / "data" / "main_data.hdf5"
    real_open = open

    def deny(path: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("rlds_cli.formats.open", deny, raising=False)
    result = runner.invoke(app, ["download", str(src), "--name", "x", "--root", str(tmp_path / "home")])
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[0] == f"error: cannot read source file {locked}: permission denied"
    assert isinstance(SourceNotReadableError("x"), PermissionError)


@pytest.mark.parametrize("fmt", [None, "d4rl"])
def test_an_hdf5_file_with_damaged_metadata_is_named_damaged(tmp_path: Path, fmt: str | None) -> None:
    """h5py raises RuntimeError (not OSError) for a metadata checksum that fails: the format
    detection and the file's check said "unexpected RuntimeError"."""
    demo = (Path(__file__).resolve().parents[2] / "rlds_cli" / "data" / "pointmass-demo-v0.hdf5").read_bytes()
    cut = 106_496  # the groups' metadata past here: the superblock still opens
    path = tmp_path / "bad.hdf5"
    path.write_bytes(demo[:cut] + bytes(b ^ 0x5A for b in demo[cut:]))
    result = runner.invoke(app, ["download", str(path), *(["--format", fmt] if fmt else [])])
    assert result.exit_code == 1, result.output
    said = " ".join(result.stderr.split())
    assert f"{path} is damaged: HDF5 cannot walk its groups" in said, said
    assert "unexpected" not in said and "Traceback" not in result.output
