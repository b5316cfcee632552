"""All terminal rendering lives here (the library never prints).

Outside text (paths, names, messages) goes through :func:`escape` before Rich markup, so a ``[``
in a path is printed literally. Tables go through :func:`print_table`, which never cuts an
identifier. Glyphs outside ASCII fall back to ASCII when the output encoding cannot show them
(:func:`glyph`). :func:`handle_errors` turns exceptions into one red line, a hint and an exit code.

Options shared by several commands, so every command spells them the same way.

The conventions (docs/cli.md, "Conventions"; tests/cli/test_cli_conventions.py checks them over the
whole app): ``-h`` everywhere; ``--json``, ``-q`` and ``-v`` on every command; a new dataset's
name is ``--name/-n``; ``-f`` is ``--force``; ``--storage`` is memmap or zarr.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, cast

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text
from typer._click.exceptions import ClickException  # typer vendors click: its usage errors

from rlds_cli import settings
from rlds_cli._util import signals
from rlds_cli._util.io import named_by_temp
from rlds_cli.errors import (
    GYMNASIUM_INSTALL,
    CacheNotWritableError,
    MissingExtraError,
    RldsError,
    from_os_error,
)


def silence_stdout() -> None:
    """Send what is left of stdout to /dev/null: its reader closed the pipe (``rlds list | head
    -1``). The command goes on and ends with its own exit code (rich exits 1 without a word,
    which failed ``set -o pipefail`` scripts that read only a first line)."""
    with contextlib.suppress(OSError, ValueError):  # no stdout descriptor at all: nothing to do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


class _Stdout(Console):
    """The stdout console: a closed pipe silences it (:func:`silence_stdout`)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        silence_stdout()


def write_out(text: str) -> None:
    """Write plain ``text`` to stdout and flush it; a closed pipe silences stdout
    (:func:`silence_stdout`) instead of failing the command."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()


# Rich honours NO_COLOR and drops styling when stdout is not a terminal.
console = _Stdout(highlight=False)


err_console = Console(stderr=True, highlight=False)


#: Glyphs with their ASCII stand-ins, for outputs whose encoding cannot show them.
GLYPHS = {"block": ("█", "#"), "arrow": ("→", "->"), "ellipsis": ("…", "...")}


def print_json(data: Any) -> None:
    """Write one JSON document to stdout, unstyled and unwrapped (for pipes and scripts): strict
    JSON, a float that is not finite (NaN, infinity) written as ``null``."""
    write_out(json.dumps(_finite(data), indent=2, default=str, allow_nan=False) + "\n")


def _finite(value: Any) -> Any:
    """``value`` with every float that is not finite, at any depth, replaced by ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def error(message: str, hint: str = "") -> None:
    """One red line, then a dim hint line."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True, markup=True, emoji=False)
    if hint:
        err_console.print(f"[dim]hint:[/] {escape(hint)}", soft_wrap=True, emoji=False)


def warn(message: str) -> None:
    """One yellow ``warning:`` line on stderr."""
    err_console.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True, emoji=False)


def warn_stale_children(root: Path | None, name: str) -> None:
    """After ``name`` was replaced: warn of the datasets that read its old version (views, merges,
    trims), which now refuse to read, note the copies made from it (preprocessed), and say what to
    do."""
    from rlds_cli.cache.manage import children_of
    from rlds_cli.cache.root import CacheRoot

    cache = CacheRoot(root)
    children = sorted(children_of(cache, name, reading=True))
    if children:
        names = " ".join(children)
        warn(
            f"{len(children)} dataset(s) made from the replaced {name!r} now refuse to read: {names}; "
            f"make them again, or remove them ('rlds rm {names} --yes')"
        )
    copies = sorted(children_of(cache, name, reading=False))
    if copies:
        note(
            f"{len(copies)} dataset(s) were made from the old {name!r} and still read as they were: "
            f"{' '.join(copies)}; make them again (--force) to follow the new version"
        )


def note(message: str) -> None:
    """A line on stderr that is neither a result nor a problem (what was kept, what to do next)."""
    err_console.print(escape(message), soft_wrap=True, emoji=False)


def _encodes(text: str, encoding: str) -> bool:
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def can_show(text: str, target: Console | None = None) -> bool:
    """Whether ``text`` can be written in the output encoding of ``target`` (default: stdout)."""
    return _encodes(text, (target or console).encoding)


def glyph(name: str, target: Console | None = None) -> str:
    """The glyph ``name`` of :data:`GLYPHS`, or its ASCII stand-in when it cannot be shown."""
    fancy, plain = GLYPHS[name]
    return fancy if can_show(fancy, target) else plain


def protect_streams() -> None:
    """Make stdout replace what its encoding cannot show (``PYTHONIOENCODING=ascii``, a C locale)
    instead of failing mid-output (a path or a message may hold any character); stderr does so
    by default."""
    stream = sys.stdout
    reconfigure = getattr(stream, "reconfigure", None)
    encoding = getattr(stream, "encoding", None) or "utf-8"
    if reconfigure is None or all(_encodes(fancy, encoding) for fancy, _ in GLYPHS.values()):
        return
    with contextlib.suppress(ValueError, OSError):  # a closed or exotic stream is left unchanged
        reconfigure(errors="replace")


class _LineHandler(logging.Handler):
    """Log records as ``warning: message`` lines on stderr, without time stamp, source file or
    line; ``-vv`` adds the logger's name."""

    def __init__(self, level: int, with_names: bool) -> None:
        super().__init__(level)
        self.with_names = with_names

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            where = f"{record.name}: " if self.with_names else ""
            label = record.levelname.lower()
            style = {"warning": "yellow", "error": "red", "critical": "red"}.get(label, "dim")
            line = f"[{style}]{label}:[/] {escape(where + message)}"
            err_console.print(line, soft_wrap=True, emoji=False, highlight=False)
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


def configure_logging(verbosity: int) -> None:
    """Send the library's log records to stderr: ``0`` shows warnings, ``1`` info, ``2`` and more
    debug (with the logger's name). Called once per command; a later call replaces the handler."""
    logger = logging.getLogger("rlds_cli")
    level = logging.DEBUG if verbosity >= 2 else logging.INFO if verbosity == 1 else logging.WARNING
    logger.handlers[:] = [h for h in logger.handlers if not isinstance(h, _LineHandler)]
    logger.addHandler(_LineHandler(level, with_names=verbosity >= 2))
    if verbosity:
        logger.setLevel(level)
        logger.propagate = False


def format_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, *args: Any, **kwargs: Any
) -> None:
    """``warnings.showwarning`` for the command line: ``warning: message`` without the file and
    line of the library that raised it."""
    label = "warning" if category is UserWarning else f"warning ({category.__name__})"
    err_console.print(f"[yellow]{label}:[/] {escape(str(message))}", soft_wrap=True, emoji=False)


@dataclass(frozen=True)
class Column:
    """One column of :func:`print_table`.

    Attributes:
        header: The column's title.
        justify: ``left`` or ``right`` (numbers).
        kind: ``key`` for identifiers (names, ids, keys: never cut, never wrapped), ``fixed`` for
            short values kept on one line (numbers, sizes), ``text`` for prose that may fold.
        optional: Left out first when a terminal is too narrow for the whole table.
    """

    header: str
    justify: Literal["left", "right"] = "left"
    kind: Literal["key", "fixed", "text"] = "text"
    optional: bool = False


#: A ``text`` column is given at least this many characters before columns are left out.
TEXT_MIN_WIDTH = 12


Cell = str | Text


def _plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def print_table(
    columns: Sequence[Column], rows: Sequence[Sequence[Cell]], *, title: str | None = None
) -> None:
    """Print a table on stdout without ever cutting an identifier.

    On a terminal: a Rich table whose ``key`` and ``fixed`` columns keep their full width while
    ``text`` columns fold; ``optional`` columns are left out (and a note says so) when the
    terminal is too narrow, and when even that does not fit (an id wider than the terminal),
    plain lines of the remaining columns, which the terminal wraps. Elsewhere (a pipe, a file):
    plain, complete, aligned lines of every column. ``str`` cells are printed literally.
    """
    out = console
    widths = [max([len(c.header)] + [len(_plain(r[i])) for r in rows]) for i, c in enumerate(columns)]
    if not out.is_terminal:
        _plain_table(columns, widths, rows, title)
        return
    shown = list(range(len(columns)))

    def needed(indices: list[int]) -> int:
        text_min = TEXT_MIN_WIDTH
        body = sum(min(widths[i], text_min) if columns[i].kind == "text" else widths[i] for i in indices)
        return body + 3 * len(indices) + 1  # one padding space each side, one border each, plus one

    while needed(shown) > out.width and any(columns[i].optional for i in shown):
        shown.remove(max(i for i in shown if columns[i].optional))
    if needed(shown) > out.width:  # an identifier wider than the terminal: lines it may wrap
        kept = [columns[i] for i in shown]
        _plain_table(kept, [widths[i] for i in shown], [[r[i] for i in shown] for r in rows], title)
    else:
        _rich_table(columns, widths, rows, title, shown)
    hidden = [columns[i].header for i in range(len(columns)) if i not in shown]
    if hidden:
        left_out = ", ".join(hidden)
        out.print(Text(f"({left_out} left out: the terminal is {out.width} columns wide; --json shows all)"))


def _rich_table(
    columns: Sequence[Column],
    widths: list[int],
    rows: Sequence[Sequence[Cell]],
    title: str | None,
    shown: list[int],
) -> None:
    """A Rich table of the ``shown`` columns: keys and fixed columns at full width, text folds."""
    table = Table(title=title, title_justify="left", title_style="", safe_box=True)
    for i in shown:
        col = columns[i]
        if col.kind == "text":
            table.add_column(col.header, justify=col.justify, overflow="fold")
        else:
            table.add_column(col.header, justify=col.justify, no_wrap=True, min_width=widths[i])
    for row in rows:
        table.add_row(*(cell if isinstance(cell := row[i], Text) else Text(cell) for i in shown))
    console.print(table)


def _plain_table(
    columns: Sequence[Column], widths: list[int], rows: Sequence[Sequence[Cell]], title: str | None
) -> None:
    """Aligned lines, two spaces between columns, nothing cut or wrapped (for pipes and files)."""
    lines = [title] if title else []
    for cells in ([c.header for c in columns], *([_plain(c) for c in r] for r in rows)):
        parts = [
            cell.rjust(w) if col.justify == "right" else cell.ljust(w)
            for cell, w, col in zip(cells, widths, columns, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    for line in lines:
        console.print(Text(line), soft_wrap=True, highlight=False)


def human_bytes(n: float) -> str:
    """``1.5 MiB``: bytes in binary units, one decimal."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def progress_bar(enabled: bool, *columns: ProgressColumn) -> tuple[Progress, bool]:
    """The CLI's one progress display: a description, a bar and ``columns``, on stderr, drawn only
    when ``enabled`` and stderr is a terminal, and gone once done. Returns the display and
    whether it is drawn."""
    show = enabled and err_console.is_terminal
    display = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        *columns,
        console=err_console,
        transient=True,
        disable=not show,
    )
    return display, show


@contextmanager
def counting_progress(
    enabled: bool,
    description: str,
    *columns: ProgressColumn,
    notes: Mapping[str, Callable[[int], str]] | None = None,
) -> Iterator[Callable[[str, int], None]]:
    """A library progress callback ``(event, amount)`` drawn as one :func:`progress_bar`:
    ``"start"`` (the total), ``"advance"`` (done since), ``"resume"`` (done before: the bar, and
    its speed, go on from there); an event of ``notes`` prints the line it makes of ``amount``."""
    bar, show = progress_bar(enabled, *columns)
    task: list[Any] = []

    def callback(event: str, amount: int) -> None:
        if notes and event in notes and show:
            # console.print, not log(): log() adds this file's name and line
            bar.console.print(notes[event](amount))
        if event == "start":
            task.append(bar.add_task(description, total=amount))
        elif event == "advance" and task:
            bar.advance(task[0], amount)
        elif event == "resume" and task:
            bar.reset(task[0], total=bar.tasks[0].total, completed=amount)

    with bar:
        yield callback


def conversion_progress(enabled: bool) -> contextlib.AbstractContextManager[Callable[[str, int], None]]:
    """A progress callback for :func:`rlds_cli.sources.convert.convert`."""
    columns = (MofNCompleteColumn(), TextColumn("rows"), TimeElapsedColumn(), TimeRemainingColumn())
    notes = {"hash": lambda size: f"hashed source ({human_bytes(size)})"}
    return counting_progress(enabled, "converting", *columns, notes=notes)


__all__ = [
    "Column",
    "DownloadColumn",
    "can_show",
    "configure_logging",
    "console",
    "conversion_progress",
    "counting_progress",
    "err_console",
    "error",
    "escape",
    "format_warning",
    "glyph",
    "human_bytes",
    "note",
    "print_json",
    "print_table",
    "progress_bar",
    "protect_streams",
    "silence_stdout",
    "warn",
    "write_out",
]


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``1 segment``, ``2,000 segments``."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


F = TypeVar("F", bound=Callable[..., Any])


DEBUG_HINT = "set RLDS_DEBUG=1 for the full traceback"


#: Modules a command may need that a user can be missing: what to install for each.
INSTALL_HINTS = {
    "torch": "install PyTorch first: pip install torch (any 2.x from 2.3 on), then run the command again",
    "matplotlib": "pip install 'rlds-cli[plot]' (matplotlib)",
    "ray": "pip install 'rlds-cli[ray]'",
    "PIL": "pip install pillow (a dependency of rlds-cli: reinstall it)",
    "simplejpeg": "pip install simplejpeg (a dependency of rlds-cli: reinstall it)",
    "tensordict": "pip install 'rlds-cli[torchrl]' (torchrl, tensordict)",
    "torchrl": "pip install 'rlds-cli[torchrl]' (torchrl, tensordict)",
    "numba": "pip install numba (a dependency of rlds-cli: the install is incomplete)",
    "gymnasium": GYMNASIUM_INSTALL,
    "fsspec": "pip install 'rlds-cli[remote]' (fsspec, s3fs)",
    "s3fs": "pip install 'rlds-cli[remote]' (fsspec, s3fs)",
    "h5py": "pip install h5py (a dependency of rlds-cli: reinstall rlds-cli)",
    "zarr": "pip install zarr (a dependency of rlds-cli: reinstall rlds-cli)",
}


def missing_module_error(exc: ImportError) -> MissingExtraError | None:
    """The clear error for an import of a module a user can install (``None`` for any other:
    a broken import inside rlds is a bug, and stays "unexpected")."""
    top = (exc.name or "").split(".")[0]
    hint = INSTALL_HINTS.get(top)
    if hint is None or not isinstance(exc, ModuleNotFoundError):
        return None
    return MissingExtraError(f"this command needs {top}, which is not installed", hint=hint)


def handle_errors(func: F) -> F:
    """Wrap a command: rlds errors become ``error: ...`` + hint and exit code 1; a missing
    optional module says what to install; anything unexpected is one line with a pointer to
    ``RLDS_DEBUG=1``; Ctrl-C exits 130. A ``verbose`` argument (``-v`` after the command)
    turns on logging like ``rlds -v``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("verbose"):
            configure_logging(int(kwargs["verbose"]))
        signals.forget_published()
        try:
            # before the command: the handlers below ask RLDS_DEBUG again, where a bad value
            # would raise inside the handling of another error, and RLDS_FSYNC is asked midway
            settings.check_flags()
        except RldsError as exc:
            error(exc.message, exc.hint)
            raise typer.Exit(1) from None
        try:
            return func(*args, **kwargs)
        except (typer.Exit, ClickException):  # usage errors: typer prints them, exit 2
            raise
        except RldsError as exc:
            if settings.debug():
                raise
            error(exc.message, exc.hint)
            raise typer.Exit(1) from None
        except (ModuleNotFoundError, OSError) as exc:  # a missing extra, a full disk...
            known: RldsError | None
            if isinstance(exc, ModuleNotFoundError):
                known = missing_module_error(exc)
            else:
                # the path the user gave, never a temporary one (.out.npz.PID.TID.partial)
                where = named_by_temp(str(exc.filename)) if exc.filename is not None else None
                known = from_os_error(exc, where) or _path_gone(exc)
            if known is None or settings.debug():
                raise _unexpected(exc) from None
            error(known.message, known.hint)
            raise typer.Exit(1) from None
        except KeyboardInterrupt as exc:
            what, code = interruption(exc)
            said, hint = INTERRUPTED.get(func.__name__, ("nothing was published", ""))
            done = signals.published()
            if done:  # the interruption came after a publish: that part is done
                said = f"{', '.join(done)} {'was' if len(done) == 1 else 'were'} published whole before it"
                hint = ""
            error(f"{what}; {said}", hint)
            raise typer.Exit(code) from None
        except Exception as exc:
            raise _unexpected(exc) from None

    return cast(F, wrapper)  # functools.wraps: the same call signature as func


#: What an interrupted command says beside "interrupted", and its hint, where the default
#: ("nothing was published", no hint) says too little or too much: preprocess keeps its finished
#: chunks; a push's commit may reach the remote before its answer comes back; a demo's dataset is
#: made before its loader runs; rm and gc remove one thing at a time, each whole; the commands that
#: only read change nothing; show and stats write their file (a page, a table) whole or not at all.
INTERRUPTED = {
    "preprocess": (
        "nothing was published",
        "run the same command with --resume to keep the chunks that finished",
    ),
    "push": (
        "the remote holds the earlier version or this one whole, never a part",
        "run the same push again: it uploads only what is missing",
    ),
    "demo": (
        "a dataset made before the interruption stays ('rlds list')",
        "run the same command again: it reuses what is made",
    ),
    "rm": (
        "each dataset named is still there whole or gone, never a part",
        "'rlds list' shows which remain; 'rlds gc' frees the space of one stopped mid-deletion",
    ),
    "gc": ("what it removed is gone, the rest stays", "run 'rlds gc' again to finish"),
    **dict.fromkeys(("show", "stats"), ("nothing was written", "")),
    **dict.fromkeys(
        ("audit", "du", "info", "inspect", "list_datasets", "path", "score", "verify"),
        ("nothing was changed", ""),
    ),
}


def interruption(exc: KeyboardInterrupt) -> tuple[str, int]:
    """What stopped a command (``"interrupted"`` by Ctrl-C, ``"terminated (SIGTERM)"``) and its
    exit code (:func:`~rlds_cli._util.signals.exit_code`)."""
    code = signals.exit_code(exc)
    return ("terminated (SIGTERM)" if code == signals.TERMINATED_EXIT else "interrupted"), code


def _path_gone(exc: OSError) -> RldsError | None:
    """A path the command made or wrote that the system says is not there (a folder removed
    while the command ran, one under ``/proc`` that cannot hold files): named as the user named
    it (never a temporary name); ``None`` for any other error."""
    if not isinstance(exc, FileNotFoundError) or exc.filename is None:
        return None
    return CacheNotWritableError(
        f"no such file or folder: {named_by_temp(str(exc.filename))}",
        hint="a folder on that path is missing, was removed while the command ran, or cannot hold "
        "files (/proc, /sys): pick another path",
    )


def _unexpected(exc: Exception) -> BaseException:
    """Re-raise under RLDS_DEBUG; else report ``unexpected ...`` and exit 1."""
    if settings.debug():
        return exc
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    error(f"unexpected {type(exc).__name__}: {first}", DEBUG_HINT)
    return typer.Exit(1)


RootOption = Annotated[
    Path | None,
    typer.Option(
        "--root",
        help="Cache root (default: $RLDS_HOME, else the user cache dir).",
        show_default=False,
        readable=False,  # an unreadable root is rlds's one-line error, as through RLDS_HOME
    ),
]


JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of text.")]


QuietOption = Annotated[
    bool,
    typer.Option(
        "--quiet",
        "-q",
        help="Print only the names (or paths) the command lists, creates or removes, one per line.",
    ),
]


VerboseOption = Annotated[
    int,
    typer.Option(
        "--verbose", "-v", count=True, show_default=False, help="Log what happens (-v: info, -vv: debug)."
    ),
]


StorageOption = Annotated[
    str | None,
    typer.Option(
        "--storage", help="Storage of the new dataset: memmap (default) or zarr.", show_default=False
    ),
]


#: What a conversion does with camera frames (rlds_cli.frames.codecs).
FramesOption = Annotated[
    str | None,
    typer.Option(
        "--frames",
        metavar="MODE",
        help="Camera frames: keep (default: frames that arrive encoded keep their bytes, arrays stay "
        "arrays), raw (decode all), jpeg[:QUALITY] (default 93), png or webp (lossless): encode arrays.",
        show_default=False,
    ),
]


#: The name of the dataset a command creates.
NameOption = Annotated[
    str | None, typer.Option("--name", "-n", help="Name of the new dataset in the cache.", show_default=False)
]
#: ``--name`` of the commands whose new dataset has no default name (the help says it is required).
RequiredNameOption = Annotated[
    str, typer.Option("--name", "-n", help="Name of the new dataset in the cache.", show_default=False)
]


def force_option(help: str) -> Any:
    """``--force/-f`` with a command's own help text."""
    return typer.Option("--force", "-f", help=help)
