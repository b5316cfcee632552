"""Rules for untrusted source files (what a downloaded file may make rlds read, allocate or write),
with bounded reads of JSON metadata files and a restricted unpickler.

Every reader applies these rules before it reads data (``docs/formats.md``, "Untrusted input";
archives: :mod:`rlds_cli.formats.archives`):

* **Numeric arrays only.** Observations, actions, rewards and done flags must be bool, integer,
  float or complex arrays with one row per step (:func:`require_numeric`, :func:`require_rows`).
  Strings, objects, compound records, void bytes and dates are refused, naming file and key;
  only per-step *info* text columns are dropped with a note.
* **Declared sizes must be backed by data.** An array declaring more than
  :data:`RATIO_FLOOR_BYTES` and more than ``RLDS_SOURCE_MAX_RATIO`` (default 100) times the bytes
  the file stores for it (a gzip stream of zeros, unwritten HDF5 chunks, an inflating ``.npz``
  member) is refused before anything is allocated or written (:func:`check_declared`).
* **Side arrays are small.** Arrays that are not per step (D4RL ``metadata/*``, arrays of another
  length), kept whole in the manifest or ``source_metadata.npz``, may declare at most
  ``RLDS_SIDE_ARRAY_MAX_BYTES`` each (default 64 MiB, :func:`check_side_array`).

JSON metadata files (LeRobot's ``info.json``, TFDS's ``features.json``, TensorDict's
``meta.json``, Minari's ``metadata.json``) are size-bounded, parsed, and fail with one error
naming the file (:func:`read_json_file`).

**Pickles** of numpy arrays (Gen-DGRL ``.npy``) are read by a restricted unpickler
(:func:`unpickle`) that allows what the Gen-DGRL layout needs (``docs/formats.md``, "Gen-DGRL"):
TorchRL's ``.npy`` members are ``np.save(f, dict)``, a 0-d object array holding a dict of numeric
arrays (the collector, ``gen_dgrl/procgen/online/datasets/storage.py``, builds each value with
``np.array(list, dtype=...)``). A pickle may ask for:

* ``numpy.ndarray``, ``_reconstruct``, ``scalar`` (protocols 2-4), ``_frombuffer`` (protocol 5);
* ``numpy.dtype`` and its classes (``numpy.dtypes.Float32DType``...), every dtype state checked at
  ``BUILD``: a plain dtype (no fields, sub-arrays or metadata) with the flags, size and alignment
  numpy computes for it (a state clearing an object dtype's flags would make numpy read raw bytes
  as pointers: a crash, not an error);
* object dtype only for a 0-d array (``np.save``'s wrapper); every other array numeric;
* ``_codecs.encode`` with ``latin1`` only (how protocol 2 writes bytes), its output counted
  against a budget of the pickle's own size before encoding, so a pickle encoding more than it
  holds (one memoised string fetched a thousand times) is refused before it allocates.

Any other global is refused before it is looked up, naming the file and the global.
"""

from __future__ import annotations

import codecs
import importlib
import io
import json
import os
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, ClassVar

import numpy as np

from rlds_cli import settings
from rlds_cli.cache.ted import describe_dtype, is_numeric
from rlds_cli.errors import RldsError, SourceError, SourceFormatError

__all__ = ["MAX_JSON_BYTES", "check_json_size", "read_json_file"]


#: Below this many declared bytes an array is never called a bomb (small all-zero columns, such
#: as a bool ``terminals``, compress extremely well).
RATIO_FLOOR_BYTES = 64 << 20
#: Default largest ratio of declared bytes to stored bytes for one array above the floor.
DEFAULT_MAX_RATIO = 100.0
#: Default largest side array (not per step) read whole.
DEFAULT_SIDE_ARRAY_MAX_BYTES = 64 << 20


class UnsafeSourceError(SourceFormatError):
    """A source file that points at data outside itself (HDF5 external or soft links, external raw
    storage, virtual datasets), declares far more data than it holds (a decompression bomb, a sparse
    dataset), or has a side array over the size limit."""

    default_hint = (
        "the file is malicious or broken: get it from a trusted source; rlds reads only data stored "
        "in the file itself"
    )


def max_ratio() -> float:
    """Largest declared/stored ratio of one source array (``RLDS_SOURCE_MAX_RATIO``, default 100)."""
    return settings.source_max_ratio(DEFAULT_MAX_RATIO)


def side_array_max_bytes() -> int:
    """Largest side array read whole (``RLDS_SIDE_ARRAY_MAX_BYTES``, default 64 MiB)."""
    return settings.side_array_max_bytes(DEFAULT_SIDE_ARRAY_MAX_BYTES)


def declared_bytes(shape: Sequence[int], dtype: np.dtype) -> int:
    """In-memory bytes of an array of ``shape`` and ``dtype``, as a Python int (a hostile shape cannot
    wrap around as in int64 ``np.prod``)."""
    count = 1
    for dim in shape:
        count *= int(dim)
    return count * max(np.dtype(dtype).itemsize, 1)


def check_declared(
    where: object, key: str | None, declared: int, stored: int, *, how: str = "stores"
) -> None:
    """Refuse an array that declares far more bytes than the file holds for it.

    Args:
        where: The source file (named in the message).
        key: The array's name in the source (``None``: all of its arrays together).
        declared: Bytes the array takes once read (:func:`declared_bytes`).
        stored: Bytes the file stores for it (compressed size, allocated HDF5 storage).
        how: Verb for the message (``"stores"``, ``"compresses into"``).

    Raises:
        UnsafeSourceError: Over :data:`RATIO_FLOOR_BYTES` and over :func:`max_ratio` times
            ``stored``.
    """
    if declared <= RATIO_FLOOR_BYTES:  # the common case, without reading the environment
        return
    ratio = max_ratio()
    if declared > ratio * max(stored, 1):
        raise UnsafeSourceError(
            f"{where}: {'its arrays together' if key is None else repr(key)} declare"
            f"{'' if key is None else 's'} {declared:,} bytes but the file {how} only {stored:,} for "
            f"{'them' if key is None else 'it'} "
            f"(ratio over {ratio:g}); refusing (a decompression bomb or a sparse dataset?)",
            hint="if you trust the file, raise RLDS_SOURCE_MAX_RATIO (declared/stored bytes per array)",
        )


def check_chunks(where: object, key: str, chunks: Sequence[int], dtype: np.dtype, declared: int) -> None:
    """Refuse chunks far larger than the array they hold: a reader inflates a chunk whole before it
    cuts its rows (a 48-byte array declared in chunks of 480 MB).

    Raises:
        SourceFormatError: A chunk of no row or column (a size of 0 or less on some axis).
        UnsafeSourceError: A chunk over :data:`RATIO_FLOOR_BYTES` and over twice the array.
    """
    if any(int(n) <= 0 for n in chunks):  # no chunk grid covers the array (zarr divides by them)
        raise SourceFormatError(
            f"{where}: {key!r} declares chunks of shape {list(chunks)}: each size must be 1 or more"
        )
    chunk = declared_bytes(chunks, dtype)
    if chunk > RATIO_FLOOR_BYTES and chunk > 2 * declared:
        raise UnsafeSourceError(
            f"{where}: {key!r} declares chunks of {chunk:,} bytes for {declared:,} bytes of data; "
            "refusing (a decompression bomb?)",
            hint="if you trust the file, rewrite it with chunks no larger than its arrays",
        )


def check_side_array(where: object, key: str, shape: Sequence[int], dtype: np.dtype) -> None:
    """Refuse a side array (not per step, read whole) over :func:`side_array_max_bytes`."""
    # variable-length values (strings, ragged arrays) count at least a pointer each
    dtype = np.dtype(dtype)
    nbytes = declared_bytes(shape, dtype if dtype.kind != "O" else np.dtype((np.void, 16)))
    limit = side_array_max_bytes()
    if nbytes > limit:
        raise UnsafeSourceError(
            f"{where}: {key!r} is a side array (not one row per step) of shape {tuple(shape)} taking "
            f"{nbytes:,} bytes, over the limit of {limit:,} for arrays read whole",
            hint="if you trust the file and want the array kept, raise RLDS_SIDE_ARRAY_MAX_BYTES",
        )


def require_numeric(where: object, key: str, dtype: np.dtype) -> None:
    """Refuse a step array (observation, action, reward, flag, info) that is not numeric.

    Raises:
        SourceFormatError: Naming ``where`` and ``key`` and what the values are.
    """
    if not is_numeric(dtype):
        raise SourceFormatError(
            f"{where}: {key!r} holds {describe_dtype(dtype)}; rlds stores numeric arrays only "
            "(bool, integers, floats)",
            hint="convert the array to numbers (e.g. floats) and write the file again",
        )


def require_shape(where: object, key: str, shape: object) -> tuple[int, ...]:
    """A declared shape as a tuple of non-negative integers; anything else is refused."""
    if not isinstance(shape, list | tuple) or not all(
        isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise SourceFormatError(
            f"{where}: {key!r} declares the shape {shape!r}, which is not a list of sizes >= 0",
            hint="the file is damaged or was not written by the format's library",
        )
    return tuple(int(d) for d in shape)


def require_rows(where: object, key: str, shape: Sequence[int]) -> None:
    """Refuse a step array without a row axis (a 0-d scalar where one row per step is needed)."""
    if len(shape) == 0:
        raise SourceFormatError(
            f"{where}: {key!r} is a single value (0-d), not an array with one row per step",
            hint="the file is not in the format's layout; check it, or pass --format for another format",
        )


#: Largest JSON metadata file read (refused before any of it is read).
MAX_JSON_BYTES = 64 << 20


def check_json_size(path: Path, what: str = "metadata") -> None:
    """Refuse ``path`` where it is over :data:`MAX_JSON_BYTES`; ``what`` names it in the error.

    Raises:
        SourceFormatError: ``<path> is <n> bytes, over the <max> read for <what>``.
        OSError: ``path`` cannot be stat'ed.
    """
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise SourceFormatError(f"{path} is {size:,} bytes, over the {MAX_JSON_BYTES:,} read for {what}")


def read_json_file(path: Path, what: str = "metadata") -> Any:
    """The JSON file at ``path``, parsed (any JSON value: the caller checks its shape).

    Raises:
        SourceFormatError: It is over :data:`MAX_JSON_BYTES` (:func:`check_json_size`), or
            missing, unreadable, not UTF-8 or not JSON (``<path> is not readable JSON: <why>``).
    """
    try:
        check_json_size(path, what)
        return json.loads(path.read_text(encoding="utf-8"))
    except SourceFormatError:
        raise
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise SourceFormatError(f"{path} is not readable JSON: {exc}") from None


def files_inside(folder: Path) -> list[Path]:
    """Every file under ``folder``, sorted, symlinks followed where they stay inside it (a folder
    reached twice is walked once).

    Raises:
        UnsafeSourceError: A symlink (to a file or a folder) leads outside ``folder``: a conversion
            never reads another local file. (A link to nothing, or a loop, is no file: skipped.)
    """
    top = folder.resolve()
    files: list[Path] = []
    walked: set[Path] = {top}
    pending = [folder]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                path = Path(entry.path)
                real = None
                if entry.is_symlink():
                    try:
                        real = path.resolve(strict=True)
                    except (OSError, RuntimeError):  # a link to nothing, or a loop: no file to read
                        continue
                    if not real.is_relative_to(top):
                        raise UnsafeSourceError(
                            f"{path} escapes the source folder {folder} (to {real})",
                            hint="rlds reads only files inside the source folder; copy the data in, or "
                            "the source is malicious or broken",
                        )
                if entry.is_dir():
                    real = real or path.resolve()
                    if real not in walked:
                        walked.add(real)
                        pending.append(path)
                elif entry.is_file():
                    files.append(path)
    return sorted(files)


_ALLOW_HINT = "pass --allow-pickle (options={'allow_pickle': True}) only if you trust the file"


def _numpy_module(name: str) -> Any:
    """``numpy._core.<name>`` (numpy 2), else ``numpy.core.<name>`` (numpy 1.x)."""
    try:
        return importlib.import_module(f"numpy._core.{name}")
    except ImportError:  # pragma: no cover - numpy < 1.26
        return importlib.import_module(f"numpy.core.{name}")


class _Encoder:
    """``_codecs.encode`` for a pickle: ``latin1`` only, output bytes counted against a budget."""

    def __init__(self, where: str, budget: int) -> None:
        self.where, self.left = where, budget

    def __call__(self, obj: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        if encoding != "latin1" or errors != "strict" or not isinstance(obj, str):
            raise UnsafeSourceError(
                f"{self.where}: the pickle asks for _codecs.encode({type(obj).__name__}, {encoding!r}); "
                "only encode(str, 'latin1') is part of a numpy array (refused: other codecs can "
                "multiply the data)",
                hint=_ALLOW_HINT,
            )
        self.left -= len(obj)  # latin1: one byte per character, known before encoding
        if self.left < 0:
            raise UnsafeSourceError(
                f"{self.where}: the pickle encodes more bytes than it holds (a string reused to "
                "multiply memory?); refused before allocating",
                hint=_ALLOW_HINT,
            )
        return codecs.encode(obj, "latin1")


def _allowed_global(module: str, name: str, encoder: _Encoder | None = None) -> Any:
    """The object a pickle of numpy arrays may ask for, or ``None``."""
    if module == "numpy" and name in ("ndarray", "dtype"):
        return getattr(np, name)
    if module in ("numpy.core.multiarray", "numpy._core.multiarray") and name in ("_reconstruct", "scalar"):
        return getattr(_numpy_module("multiarray"), name)
    if module in ("numpy.core.numeric", "numpy._core.numeric") and name == "_frombuffer":
        return _numpy_module("numeric")._frombuffer
    if module == "numpy.dtypes" and name.endswith("DType"):
        found = getattr(importlib.import_module("numpy.dtypes"), name, None)
        return found if isinstance(found, type) and issubclass(found, np.dtype) else None
    if (module, name) == ("_codecs", "encode"):
        return encoder
    return None


def _refuse_dtype(where: str, state: Any, why: str) -> UnsafeSourceError:
    return UnsafeSourceError(
        f"{where}: the pickle sets a dtype's state to {state!r}, {why}; refused (such a dtype can make "
        "numpy read raw bytes as object pointers)",
        hint=_ALLOW_HINT,
    )


def checked_dtype_state(where: str, dtype: np.dtype, state: Any) -> None:
    """Refuse a dtype state that does not describe the dtype as numpy itself would.

    The state is applied to a copy, which must be a plain dtype (no fields, sub-array or metadata)
    equal to the canonical dtype of its type string, with the same flags (``hasobject``,
    ``NPY_LIST_PICKLE``...), item size and alignment.
    """
    if not isinstance(state, tuple) or len(state) not in (8, 9) or state[0] not in (3, 4):
        raise _refuse_dtype(where, state, "which is not a plain dtype's state")
    probe = np.dtype(dtype, copy=True)
    try:
        probe.__setstate__(state)  # type: ignore[attr-defined]
    except Exception as exc:  # a malformed state raises many types
        raise _refuse_dtype(where, state, f"which numpy rejects ({exc})") from exc
    if probe.fields is not None or probe.subdtype is not None or probe.metadata:
        raise _refuse_dtype(where, state, "a record, sub-array or metadata dtype (not in Gen-DGRL data)")
    canonical = np.dtype(probe.str)
    if (probe.flags, probe.itemsize, probe.alignment, probe.str) != (
        canonical.flags,
        canonical.itemsize,
        canonical.alignment,
        canonical.str,
    ):
        raise _refuse_dtype(
            where,
            state,
            f"whose flags or sizes differ from numpy's own for {canonical.str} (flags {canonical.flags})",
        )


#: The pure-Python unpickler (typeshed does not describe it; its BUILD opcode can be overridden).
_PyUnpickler: Any = pickle._Unpickler


class _NumpyOnlyUnpickler(_PyUnpickler):
    """Unpickles numpy arrays, dtypes, scalars and plain containers; refuses every other global before
    it is imported (no code of the pickle's choosing runs) and every dtype or array state numpy would
    misread. Pure-Python, because only its ``BUILD`` can be checked.
    """

    dispatch: ClassVar[dict[int, Any]] = dict(_PyUnpickler.dispatch)

    def __init__(self, file: IO[bytes], where: str, budget: int) -> None:
        super().__init__(file, encoding="ASCII")
        self.where = where
        self.encoder = _Encoder(where, budget)

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed_global(module, name, self.encoder)
        if found is None:
            raise UnsafeSourceError(
                f"{self.where}: the pickle asks for {module}.{name}, which is not part of a numpy array; "
                "refused (unpickling it could run code)",
                hint=_ALLOW_HINT,
            )
        return found

    def load_build(self) -> None:
        state = self.stack[-1]
        inst = self.stack[-2]
        if isinstance(inst, np.dtype):
            checked_dtype_state(self.where, inst, state)
        elif isinstance(inst, np.ndarray):
            _check_array_state(self.where, state)
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build


def _check_array_state(where: str, state: Any) -> None:
    """An ndarray state ``(version, shape, dtype, fortran, data)``: object values only 0-d."""
    if not isinstance(state, tuple) or len(state) not in (4, 5) or not isinstance(state[-3], np.dtype):
        raise SourceFormatError(f"{where}: the pickle sets an array's state to something that is not one")
    dtype, shape = state[-3], state[-4]
    if dtype.fields is not None or dtype.subdtype is not None or dtype.flags != np.dtype(dtype.str).flags:
        raise _refuse_dtype(where, dtype, "not a plain dtype as numpy builds it")
    if dtype.hasobject and shape != ():
        raise UnsafeSourceError(
            f"{where}: the pickle holds an array of Python objects of shape {shape!r}; Gen-DGRL "
            "trajectories hold numeric arrays only (object values are read only as np.save's 0-d wrapper)",
            hint=_ALLOW_HINT,
        )


def unpickle(data: bytes | IO[bytes], where: str, allow_pickle: bool, budget: int | None = None) -> Any:
    """Unpickle ``data`` (a stream positioned at the pickle, or its bytes).

    Args:
        data: The pickle.
        where: The file (and member), for messages.
        allow_pickle: Trusted files only: a plain unpickler that runs whatever the pickle asks for.
        budget: Bytes ``_codecs.encode`` may produce; default: the bytes left in the stream.

    Raises:
        UnsafeSourceError: A global, dtype, array or encode the restriction refuses.
        SourceFormatError: A damaged pickle.
    """
    fh = io.BytesIO(data) if isinstance(data, bytes) else data
    if budget is None:
        here = fh.tell()
        budget = fh.seek(0, io.SEEK_END) - here
        fh.seek(here)
    try:
        if allow_pickle:
            return pickle.Unpickler(fh, encoding="ASCII").load()
        return _NumpyOnlyUnpickler(fh, where, budget).load()
    except RldsError:
        raise
    except ModuleNotFoundError as exc:  # only with allow_pickle: the pickle names a missing module
        raise SourceError(f"{where}: unpickling needs the module {exc.name!r}, not installed") from exc
    except Exception as exc:  # a damaged pickle raises many types
        raise SourceFormatError(
            f"{where}: not a readable pickle (truncated or corrupt?): {type(exc).__name__}: {exc}"
        ) from exc
