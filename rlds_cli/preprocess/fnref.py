"""Resolving the user's function from a reference string, the same way in every process.

A reference is ``"package.module:function"`` (imported with the working directory on ``sys.path``,
as ``python -m`` would) or ``"path/to/file.py:function"`` (loaded from that file). Only the string
travels to worker processes and Ray tasks; each resolves it (a module's function from
``sys.modules`` at each call, a file's compiled once per content), so the function never has to
pickle. A module of the user's edited since this process imported it is refused before a job
runs (:func:`check_loaded_code`). For a Ray node without the caller's files, the Ray executor ships a
file's bytes with the job (:func:`file_source`, compiled there by :func:`resolve`) and a module
found outside the installed packages as a ``py_modules`` entry (:func:`module_root`).

This module is the boundary with user code: :func:`call_user` turns what the function raises into a
:class:`~rlds_cli.errors.UserFunctionError` with the user's traceback (:func:`user_traceback`). It
imports nothing of the job's: worker and coordinator both depend on it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import linecache
import os
import pickle
import site
import sys
import sysconfig
import traceback
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlds_cli._util.io import sha256_file
from rlds_cli.errors import FunctionImportError, UserFunctionError

_CACHE: dict[str, Callable[..., Any]] = {}
_HELPER_MODULES_LIMIT = 2000  # modules looked at for the user's helpers (bounds the walk)


def _is_path_ref(module_part: str) -> bool:
    return module_part.endswith(".py") or os.sep in module_part or "/" in module_part


def split_ref(ref: str) -> tuple[str, str]:
    """``"a.b:f"`` -> ``("a.b", "f")``; raises :class:`FunctionImportError` when malformed."""
    module_part, sep, name = ref.rpartition(":")
    if not sep or not module_part or not name or not all(p.isidentifier() for p in name.split(".")):
        raise FunctionImportError(f"--fn {ref!r} is not of the form 'module:function' or 'file.py:function'")
    return module_part, name


def _check_source_file(path: Path, ref: str) -> None:
    """Refuse a ``--fn`` path that is no file: missing, or a folder (it said "does not exist")."""
    if path.is_dir():
        raise FunctionImportError(
            f"--fn {ref!r}: {path} is a folder, not a Python file",
            hint="name the file that defines the function: path/to/file.py:function",
        )
    if not path.is_file():
        raise FunctionImportError(f"--fn {ref!r}: file {path} does not exist")


def _load_file_module(path: Path, ref: str) -> Any:
    _check_source_file(path, ref)
    cwd = os.getcwd()
    if cwd not in sys.path:
        # last, as each worker puts it: the file's imports of modules beside the caller resolve
        # the same in this process as in the job's workers
        sys.path.append(cwd)
    return _module_from_source(path, str(path.resolve()), path.read_bytes(), ref)


def _module_from_source(path: Path, resolved: str, source: bytes, ref: str) -> Any:
    """Compile ``source`` (the bytes of the file at ``path``, ``resolved`` on the caller's
    machine) as a module; the same module name in every process that got the same bytes."""
    # the bytes are part of the module's name: a file edited within one process (a notebook) is
    # imported afresh, so the function that runs is the one its lineage hashes
    digest = hashlib.sha256(resolved.encode() + b"\0" + source).hexdigest()[:12]
    mod_name = f"rlds_user_fn_{path.stem}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise FunctionImportError(f"--fn {ref!r}: {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # so objects defined there pickle by reference
    text = source.decode("utf-8", "replace")
    # tracebacks show the shipped lines, also on a node where the file is missing or differs
    # (an entry without an mtime is never checked against the disk)
    linecache.cache[str(path)] = (len(text), None, text.splitlines(keepends=True), str(path))
    try:
        # from the hashed bytes, never __pycache__ (a .pyc is trusted on whole-second mtime and size)
        exec(compile(source, str(path), "exec"), module.__dict__)
    except BaseException as exc:
        del sys.modules[mod_name]
        raise _import_failed(ref, exc) from None
    return module


def _import_failed(ref: str, exc: BaseException) -> UserFunctionError:
    """The module raised while being imported: the user's code failing."""
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


def resolve(ref: str, shipped: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """The callable named by ``ref`` (a file's cached per process and file content).

    ``shipped`` is :func:`file_source`'s answer for a file reference, made where the file is:
    the function is compiled from those bytes, whatever this machine has at that path.

    Raises:
        FunctionImportError: Malformed reference, missing module or file, missing name, or
            an object that is not callable.
        UserFunctionError: The module raised while being imported.
    """
    module_part, name = split_ref(ref)
    # a module's function is looked up in sys.modules each time (after importlib.reload, the
    # new one); a file's is cached by the file's bytes (it may change between two calls)
    key = None
    if shipped is not None:
        key = f"{ref}@{shipped['sha256']}"
    elif _is_path_ref(module_part):
        path = Path(module_part).expanduser()
        if path.is_file():
            key = f"{ref}@{sha256_file(path)}"
    fn = _CACHE.get(key) if key is not None else None
    if fn is not None:
        return fn
    if shipped is not None:
        module = _module_from_source(Path(shipped["path"]), shipped["resolved"], shipped["source"], ref)
    elif _is_path_ref(module_part):
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
    if key is not None:
        _CACHE[key] = obj
    return obj


def _source_files(target: Any) -> list[str]:
    """The source files of ``target`` and of what it wraps (``functools.wraps``: ``__wrapped__``),
    each once, in that order."""
    files: list[str] = []
    for obj in (target, inspect.unwrap(target) if callable(target) else target):
        try:
            source = inspect.getsourcefile(obj)
        except TypeError:
            continue
        if source and Path(source).is_file() and source not in files:
            files.append(source)
    return files


def describe(fn: str | Callable[..., Any]) -> tuple[str, str | None]:
    """The reference recorded in lineage and the sha256 of the file that defines the function.

    For a reference string the file is the module's source file; for a callable passed from
    Python it is ``inspect.getsourcefile``'s answer, else the sha256 of its pickle. A decorated
    function's digest covers the file that defines it too (``__wrapped__``), so an edit of it is
    a new job.
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
    files = _source_files(target)
    if len(files) == 1:
        return ref, sha256_file(files[0])
    if files:  # a decorated function: the decorator's file, and the one its function is defined in
        joined = "".join(f"{f}\0{sha256_file(f)}\n" for f in files)
        return ref, hashlib.sha256(joined.encode()).hexdigest()
    try:
        return ref, hashlib.sha256(pickle.dumps(target)).hexdigest()
    except Exception:
        return ref, None


def _user_modules(target: Callable[..., Any]) -> list[tuple[Any, Path]]:
    """The user's own modules ``target`` runs, each with its source file: its module first, then
    the modules its globals hold (a module, or a function or class defined in one) and the loaded
    modules its ``import`` statements name (``from helper import SCALE`` holds a float, which
    names no module), then theirs, and so on, whose source file lies outside the installed
    packages, the standard library and rlds. A module not imported yet is not seen."""
    start = sys.modules.get(str(getattr(inspect.unwrap(target), "__module__", "")))
    if start is None:
        return []
    skipped = [*_installed_dirs(), Path(__file__).resolve().parents[1]]  # rlds_cli itself
    found_modules: list[tuple[Any, Path]] = []
    seen, queue = {id(start)}, [start]
    file = getattr(start, "__file__", None)
    if isinstance(file, str) and Path(file).suffix == ".py" and Path(file).is_file():
        found_modules.append((start, Path(file).resolve()))
    while queue and len(seen) < _HELPER_MODULES_LIMIT:
        module = queue.pop()
        for value in [*_imported_modules(module), *list(vars(module).values())]:
            try:
                found = (
                    value
                    if inspect.ismodule(value)
                    else sys.modules.get(str(getattr(value, "__module__", "")))
                )
                file = getattr(found, "__file__", None)
            except Exception:  # an object whose attributes run code (a proxy): no module of the user's
                continue
            if found is None or id(found) in seen or not isinstance(file, str):
                continue
            seen.add(id(found))
            where = Path(file).resolve()
            if where.suffix != ".py" or not where.is_file() or any(where.is_relative_to(d) for d in skipped):
                continue  # installed, standard library, rlds, or compiled: not the user's source
            queue.append(found)
            found_modules.append((found, where))
    return found_modules


def _imported_modules(module: Any) -> list[Any]:
    """The loaded modules that ``module``'s source file imports from (its ``import`` and
    ``from ... import`` statements, in function bodies too; relative ones resolved)."""
    file = getattr(module, "__file__", None)
    try:
        tree = ast.parse(Path(file).read_bytes()) if isinstance(file, str) and file.endswith(".py") else None
    except (SyntaxError, ValueError, OSError):
        return []
    names: list[str] = []
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            try:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), module.__package__)
            except (ImportError, ValueError, TypeError):
                continue
            names += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    return [sys.modules[n] for n in dict.fromkeys(names) if n in sys.modules]


def helpers_digest(fn: str | Callable[..., Any]) -> str | None:
    """The sha256 of the user's own modules the function's module uses (:func:`_user_modules`,
    less the files that define the function), or ``None`` when it uses none: an edit of a helper
    module, not only of the function's file, makes a new job."""
    target = resolve(fn) if isinstance(fn, str) else fn
    own = {Path(f).resolve() for f in _source_files(target)}
    files = {where for _, where in _user_modules(target) if where not in own}
    if not files:
        return None
    joined = "".join(f"{f}\0{sha256_file(f)}\n" for f in sorted(files))
    return hashlib.sha256(joined.encode()).hexdigest()


def check_loaded_code(fn: str | Callable[..., Any]) -> None:
    """Refuse to run ``fn`` where a module of the user's that it runs was edited on disk since
    this process imported it: this process would run the old code, workers started for the job
    the new, and the lineage would record the new file's digest (a notebook editing its module
    between two runs mixed both in one dataset). A file reference's own file is compiled afresh at
    each run; its helper modules, a module reference's module and a callable's are checked.

    What is compared: each function defined at the top of the module (its bytecode, names and
    constants) and each top-level UPPER_CASE constant written as an immutable literal, against the
    file now.

    Raises:
        FunctionImportError: Naming the module's file and the first name that differs.
    """
    target = resolve(fn) if isinstance(fn, str) else fn
    fresh = isinstance(fn, str) and _is_path_ref(split_ref(fn)[0])
    own = {Path(f).resolve() for f in _source_files(target)} if fresh else set()
    for module, path in _user_modules(target):
        if path in own:
            continue
        name = _stale_name(module, path)
        if name is not None:
            what = fn if isinstance(fn, str) else describe(fn)[0]
            raise FunctionImportError(
                f"--fn {what!r}: {path} changed since this process imported it ({name}): the old "
                "code would run here and the new code in the job's workers",
                hint="restart the process (a notebook: its kernel), or importlib.reload the module; "
                "a file reference (path/to/file.py:function) is read afresh at each run",
            )


def _stale_name(module: Any, path: Path) -> str | None:
    """How the first top-level function or literal constant of ``module`` whose code in ``path``
    now differs from what the module holds differs (``None``: they agree, as far as this can
    tell)."""
    if not isinstance(getattr(module, "__loader__", None), importlib.machinery.SourceFileLoader):
        return None  # compiled by another loader (pytest rewrites asserts): not comparable
    try:
        tree = ast.parse(path.read_bytes(), str(path))
        code = compile(tree, str(path), "exec")
    except (SyntaxError, ValueError, OSError):
        return "it no longer compiles"
    on_disk = {c.co_name: c for c in code.co_consts if isinstance(c, types.CodeType)}
    for name, value in list(vars(module).items()):
        try:
            inner = inspect.unwrap(value) if inspect.isfunction(value) else None
        except Exception:  # an object whose attributes run code (a proxy): no function of the user's
            continue
        if inner is None or getattr(inner, "__qualname__", None) != name:
            continue
        if Path(inner.__code__.co_filename).resolve() != path:
            continue  # imported from elsewhere
        if name not in on_disk or not _same_code(inner.__code__, on_disk[name]):
            return f"function {name!r} differs"
    # constants by convention (UPPER_CASE) of immutable literals, bound once in the whole file by
    # a top-level assignment: a name also set in an ``if``, a loop, by ``+=`` or a ``global``
    # statement (a counter or a cache the module changes while it runs) is not comparable
    bindings = _module_bindings(tree)
    constants = {
        node.targets[0].id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id.isupper()
        and bindings.get(node.targets[0].id) == 1
    }
    for constant, value_node in constants.items():
        try:
            literal = ast.literal_eval(value_node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if not isinstance(literal, int | float | complex | str | bytes | bool | tuple | type(None)):
            continue
        loaded = vars(module).get(constant, literal)
        if type(loaded) is type(literal) and not _equal(loaded, literal):
            here, there = (_short(repr(loaded)), _short(ast.unparse(value_node)))
            return f"{constant} is {here} here, {there} in the file"
    return None


def _module_bindings(tree: ast.Module) -> dict[str, int]:
    """How many times each module-level name is bound in ``tree``: by the module's statements,
    also inside its ``if``, loops, ``try`` and ``with`` (not in a function's or a class's own
    scope, whose names are theirs), and twice (never once) for a name a function declares
    ``global``."""
    bindings: dict[str, int] = {}
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bindings[node.name] = bindings.get(node.name, 0) + 1
            for inner in ast.walk(node):  # its own names are its; a global one is the module's
                if isinstance(inner, ast.Global):
                    bindings.update((name, 2) for name in inner.names)
            continue
        if isinstance(node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            continue  # a scope of its own
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            bindings[node.id] = bindings.get(node.id, 0) + 1
        todo.extend(ast.iter_child_nodes(node))
    return bindings


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # a comparison that raises (numpy arrays): not a literal of the user's
        return True


def _same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """Whether two code objects run the same: bytecode, names and constants (nested code
    compared the same way); line numbers are left out (a line added above moves them)."""
    if a.co_code != b.co_code or a.co_names != b.co_names or len(a.co_consts) != len(b.co_consts):
        return False
    for x, y in zip(a.co_consts, b.co_consts, strict=True):
        if isinstance(x, types.CodeType) and isinstance(y, types.CodeType):
            if not _same_code(x, y):
                return False
        elif type(x) is not type(y) or not _equal(x, y):
            return False
    return True


def get(fn: str | Callable[..., Any], shipped: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """The callable itself: resolved when a reference (see :func:`resolve`), as is otherwise."""
    return resolve(fn, shipped) if isinstance(fn, str) else fn


def file_source(ref: str) -> dict[str, Any] | None:
    """For a file reference, what a process that cannot read the file needs to compile it:
    ``{"path", "resolved", "source", "sha256"}``; ``None`` for a module reference.

    The bytes travel with the job, not through Ray's ``working_dir`` (which uploads the whole
    directory) or ``py_modules`` (which imports the file under its own name): every node runs
    exactly the function whose sha256 the lineage records.
    """
    module_part, _ = split_ref(ref)
    if not _is_path_ref(module_part):
        return None
    path = Path(module_part).expanduser()
    _check_source_file(path, ref)
    source = path.read_bytes()
    return {
        "path": str(path),
        "resolved": str(path.resolve()),
        "source": source,
        "sha256": hashlib.sha256(source).hexdigest(),
    }


def _installed_dirs() -> list[Path]:
    """Where installed packages and the standard library live (the same on every node of a Ray cluster)."""
    dirs = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.update(site.getsitepackages())
    dirs.add(site.getusersitepackages())
    return [Path(d).resolve() for d in dirs if d]


def module_root(ref: str) -> str | None:
    """For a module reference whose top-level package lies outside the installed packages (the
    working directory, ``PYTHONPATH``): that package's directory or single ``.py`` file, for Ray's
    ``py_modules``. ``None`` for a file reference, an installed package, or one Ray cannot ship (a
    namespace package over several directories).

    Call it after the reference was resolved in this process (the module is imported).
    """
    module_part, _ = split_ref(ref)
    if _is_path_ref(module_part):
        return None
    top = sys.modules.get(module_part.split(".")[0])
    if top is None:
        return None
    locations = list(getattr(top, "__path__", None) or [])
    if not locations and getattr(top, "__file__", None):
        locations = [top.__file__]
    if len(locations) != 1:
        return None
    where = Path(locations[0]).resolve()
    if where.suffix not in ("", ".py") or not where.exists():
        return None  # an extension module or a zip import: leave it to the node's environment
    if any(where.is_relative_to(d) for d in _installed_dirs()):
        return None
    return str(where)


# --------------------------------------------------------------------- the boundary with user code


def user_traceback(exc: BaseException, skip: int = 0) -> str:
    """The traceback of ``exc`` with the first ``skip`` frames (rlds's own) left out."""
    tb = exc.__traceback__
    for _ in range(skip):
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def call_user(fn: Callable[..., Any], batch: Any, where: str) -> Any:
    """``fn(batch)``; anything it raises (``sys.exit`` too) becomes a :class:`UserFunctionError`
    naming ``where``, with the user's traceback (this frame left out)."""
    try:
        return fn(batch)
    except SystemExit as exc:
        # the function's exit code must never become rlds's own (0 would "succeed" silently)
        raise UserFunctionError(
            f"{where}: the function called sys.exit({exc.code!r})",
            hint="return the arrays, or raise an exception to stop the job",
            user_traceback=user_traceback(exc, skip=1),
        ) from None
    except Exception as exc:
        raise UserFunctionError(
            f"{where}: the function raised {type(exc).__name__}: {_printable(exc)}",
            user_traceback=user_traceback(exc, skip=1),
        ) from None


def _printable(exc: BaseException) -> str:
    """``str(exc)``, or what Python prints where that itself raises."""
    try:
        return str(exc)
    except Exception:
        return "<exception str() failed>"
