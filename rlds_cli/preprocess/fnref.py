"""Resolving the user's function from a reference string, the same way in every process.

A reference is ``"package.module:function"`` (imported with the working directory on
``sys.path``, as ``python -m`` would) or ``"path/to/file.py:function"`` (loaded from that file).
Only the string travels to worker processes and Ray tasks; each resolves it once and caches
the result, so the function itself never has to pickle.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlds_cli.errors import FunctionImportError, UserFunctionError
from rlds_cli.hashing import sha256_file

_CACHE: dict[str, Callable[..., Any]] = {}


def _is_path_ref(module_part: str) -> bool:
    return module_part.endswith(".py") or os.sep in module_part or "/" in module_part


def split_ref(ref: str) -> tuple[str, str]:
    """``"a.b:f"`` -> ``("a.b", "f")``; raises :class:`FunctionImportError` when malformed."""
    module_part, sep, name = ref.rpartition(":")
    if not sep or not module_part or not name or not all(p.isidentifier() for p in name.split(".")):
        raise FunctionImportError(f"--fn {ref!r} is not of the form 'module:function' or 'file.py:function'")
    return module_part, name


def _load_file_module(path: Path, ref: str) -> Any:
    if not path.is_file():
        raise FunctionImportError(f"--fn {ref!r}: file {path} does not exist")
    # the file's bytes are part of the module's name: a file edited within one process (a
    # notebook) is imported afresh, so the function that runs is the one its lineage hashes
    source = path.read_bytes()
    digest = hashlib.sha256(str(path.resolve()).encode() + b"\0" + source).hexdigest()[:12]
    mod_name = f"rlds_user_fn_{path.stem}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise FunctionImportError(f"--fn {ref!r}: {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # so objects defined there pickle by reference
    try:
        # compiled from the bytes just hashed, never from __pycache__: a .pyc is trusted on the
        # source's mtime in whole seconds and its size, which an edit can leave unchanged
        exec(compile(source, str(path), "exec"), module.__dict__)
    except BaseException as exc:
        del sys.modules[mod_name]
        raise _import_failed(ref, exc) from None
    return module


def _import_failed(ref: str, exc: BaseException) -> UserFunctionError:
    """The module exists but raised while being imported: that is the user's code failing."""
    from rlds_cli.preprocess.worker import user_traceback

    return UserFunctionError(
        f"importing the module of --fn {ref!r} raised {type(exc).__name__}: {exc}",
        user_traceback=user_traceback(exc),
    )


def _import_module(module_part: str, ref: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # 'mypkg.mod:f' from the user's project, as 'python -m' finds it
    try:
        return importlib.import_module(module_part)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_part
        if module_part == missing or module_part.startswith(f"{missing}."):
            raise FunctionImportError(f"--fn {ref!r}: no module named {missing!r}") from None
        raise _import_failed(ref, exc) from None  # the module imports something missing
    except BaseException as exc:
        raise _import_failed(ref, exc) from None


def resolve(ref: str) -> Callable[..., Any]:
    """The callable named by ``ref`` (cached per process).

    Raises:
        FunctionImportError: Malformed reference, missing module or file, missing name, or
            an object that is not callable.
        UserFunctionError: The module raised while being imported.
    """
    module_part, name = split_ref(ref)
    key = ref
    if _is_path_ref(module_part):  # a file may change between two calls: cache by its bytes
        path = Path(module_part).expanduser()
        if path.is_file():
            key = f"{ref}@{sha256_file(path)}"
    fn = _CACHE.get(key)
    if fn is not None:
        return fn
    if _is_path_ref(module_part):
        module = _load_file_module(Path(module_part).expanduser(), ref)
    else:
        module = _import_module(module_part, ref)
    obj: Any = module
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise FunctionImportError(f"--fn {ref!r}: {module_part!r} has no attribute {name!r}") from None
    if not callable(obj):
        raise FunctionImportError(
            f"--fn {ref!r}: {name!r} is not callable (it is of type {type(obj).__name__})"
        )
    _CACHE[key] = obj
    return obj


def describe(fn: str | Callable[..., Any]) -> tuple[str, str | None]:
    """The reference recorded in lineage and the sha256 of the file that defines the function.

    For a reference string the file is the module's source file; for a callable passed from
    Python it is ``inspect.getsourcefile``'s answer, else the sha256 of its pickle.
    """
    if isinstance(fn, str):
        module_part, _ = split_ref(fn)
        target = resolve(fn)
        ref = fn
        if _is_path_ref(module_part):
            return ref, sha256_file(Path(module_part).expanduser())
    else:
        target = fn
        ref = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"
    try:
        source = inspect.getsourcefile(target)
    except TypeError:
        source = None
    if source and Path(source).is_file():
        return ref, sha256_file(source)
    try:
        return ref, hashlib.sha256(pickle.dumps(target)).hexdigest()
    except Exception:
        return ref, None


def get(fn: str | Callable[..., Any]) -> Callable[..., Any]:
    """The callable itself: resolved when a reference, as is otherwise."""
    return resolve(fn) if isinstance(fn, str) else fn
