"""Hostile Gen-DGRL pickles, through the CLI in a subprocess (a crash must show as a crash, not
take the test process down): a dtype state that clears an object dtype's flags (it segfaulted,
exit 139), codecs that multiply data, and a string encoded over and over from the memo.

Each is refused with exit 1, one error line (plus its hint), nothing published, and (for the
memory attacks) a peak RSS far below what the pickle asks for.
"""

from __future__ import annotations

import io
import lzma
import os
import pickle
import struct
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
from numpy.lib import format as npy_format

from rlds_cli.formats.untrusted import _numpy_module
from tests.formats_fixtures import refused

_CLI = "import sys; from rlds_cli.cli.app import main; sys.argv[0] = 'rlds'; main()"
#: What a measured subprocess prints last: the CLI's exit code and the peak RSS (KiB) of it.
_MEASURE = (
    "import resource, subprocess, sys; "
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
    "sys.stderr.write(done.stderr); "
    "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)
_RECONSTRUCT = _numpy_module("multiarray")._reconstruct


def _npy_header() -> bytes:
    head = io.BytesIO()
    npy_format.write_array_header_1_0(head, {"descr": "|O", "fortran_order": False, "shape": ()})
    return head.getvalue()


class _Reduce:
    """Pickles as ``func(*args)`` with ``state`` applied (``BUILD``): any state a file can hold."""

    def __init__(self, func: object, args: tuple[object, ...], state: object) -> None:
        self.value = (func, args, state)

    def __reduce__(self) -> tuple[object, ...]:
        return self.value


def _trajectory(observations: object) -> bytes:
    """A TorchRL-style ``.npy`` member (a pickled 0-d object array of a dict) with ``observations``."""
    traj = {
        "observations": observations,
        "actions": np.zeros((1, 1), np.int64),
        "rewards": np.zeros((1, 1), np.float32),
        "dones": np.ones(1, bool),
    }
    wrapper = _Reduce(_RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, (), np.dtype("O"), False, [traj]))
    return _npy_header() + pickle.dumps(wrapper, protocol=2)


class _Run(NamedTuple):
    """A measured ``rlds download`` (what :func:`refused` reads, and the peak RSS in MiB)."""

    returncode: int
    stderr: str
    rss_mib: int


def _run(source: Path) -> _Run:
    """``rlds download SOURCE`` in a subprocess, on the test's cache (``RLDS_HOME``)."""
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "400"}
    cli = [sys.executable, "-c", _CLI, "download", str(source), "--name", "evil", "--format", "gen_dgrl"]
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, *cli], capture_output=True, text=True, env=env, timeout=300
    )
    code, rss = done.stdout.split()[-2:]
    return _Run(int(code), done.stderr, int(rss) // 1024)


def test_an_object_dtype_with_its_flags_cleared_is_refused_not_a_segfault(tmp_path: Path) -> None:
    """``(3, '|', None, None, None, -1, -1, 0)`` clears the object dtype's flags: numpy then reads
    the array's raw bytes (0x41...) as object pointers when the list of arrays is used."""
    hollow = _Reduce(np.dtype, ("O8", False, True), (3, "|", None, None, None, -1, -1, 0))
    pointers = _Reduce(_RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, (2,), hollow, False, b"\x41" * 16))
    source = tmp_path / "evil.npy"
    source.write_bytes(_trajectory([pointers, pointers]))
    line = refused(_run(source), str(source), "(3, '|', None, None, None, -1, -1, 0)")
    assert "differ from numpy's own for |O" in line


def test_a_numeric_dtype_with_foreign_flags_is_refused(tmp_path: Path) -> None:
    """Flags numpy would not compute for ``<f4`` (here: the object bits) are refused as well."""
    odd = _Reduce(np.dtype, ("f4", False, True), (3, "<", None, None, None, -1, -1, 63))
    frames = _Reduce(_RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, (2,), odd, False, b"\0" * 8))
    source = tmp_path / "odd.npy"
    source.write_bytes(_trajectory(frames))
    refused(_run(source), str(source), "differ from numpy's own for <f4")


def test_an_array_of_python_objects_inside_the_dict_is_refused(tmp_path: Path) -> None:
    """Object values are read only as ``np.save``'s 0-d wrapper; Gen-DGRL arrays are numeric."""
    source = tmp_path / "objects.npy"
    source.write_bytes(_trajectory(np.array([np.zeros(2), np.zeros(3)], dtype=object)))
    refused(_run(source), str(source), "an array of Python objects of shape (2,)")


def _nested_hex(levels: int) -> bytes:
    """``encode(encode(...encode(b'rlds', 'hex')..., 'hex'), 'hex')``: the data doubles per level."""
    body = bytearray(b"\x80\x02c_codecs\nencode\nq\x00")
    body += b"h\x00" * levels  # the function, once per level, below its arguments
    body += b"C\x04rlds"  # SHORT_BINBYTES
    body += b"X" + struct.pack("<I", 3) + b"hex" + b"q\x01"
    body += b"\x86R"  # TUPLE2, REDUCE
    body += b"h\x01\x86R" * (levels - 1)
    body += b"."
    return _npy_header() + bytes(body)


def test_nested_codecs_in_a_300_byte_archive_fail_with_bounded_memory(tmp_path: Path) -> None:
    """30 levels of ``hex`` ask for 4 * 2**30 bytes; the archive is about 300 bytes."""
    member = _nested_hex(30)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tf:
        info = tarfile.TarInfo("g/evil.npy")
        info.size = len(member)
        tf.addfile(info, io.BytesIO(member))
    archive = tmp_path / "evil.tar.xz"
    archive.write_bytes(lzma.compress(raw.getvalue()))
    assert archive.stat().st_size < 400
    result = _run(archive)
    refused(result, str(archive), "_codecs.encode(bytes, 'hex')", "only encode(str, 'latin1')")
    assert result[2] < 500, f"peak RSS {result[2]} MiB"


def test_a_string_encoded_again_and_again_from_the_memo_is_refused_before_allocating(tmp_path: Path) -> None:
    """One 1 MiB string, encoded 2,000 times (2 GiB) by fetching it from the memo: the encodes
    together may not exceed the pickle's own size."""
    text = "x" * (1 << 20)
    body = bytearray(b"\x80\x02c_codecs\nencode\nq\x00")
    body += b"X" + struct.pack("<I", len(text)) + text.encode() + b"q\x01"
    body += b"X" + struct.pack("<I", 6) + b"latin1" + b"q\x02"
    body += b"("  # MARK: a list of every copy
    body += b"h\x00h\x01h\x02\x86R" * 2000
    body += b"l."  # LIST, STOP
    source = tmp_path / "memo.npy"
    source.write_bytes(_npy_header() + bytes(body))
    result = _run(source)
    refused(result, str(source), "encodes more bytes than it holds")
    assert result[2] < 500, f"peak RSS {result[2]} MiB"
