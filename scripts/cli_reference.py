"""The CLI reference page (docs/cli.md), generated from the app itself.

``python scripts/cli_reference.py docs/cli.md`` rewrites the page; a test checks that the
committed page equals what the code generates.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rlds_cli.cli.app import app

WIDTH = 100
HEADER = """# CLI reference

Generated from the application by `python scripts/cli_reference.py docs/cli.md`; a test
fails when this page and the code disagree, and `tests/cli/test_cli_conventions.py` checks the
conventions below over every command.

## Conventions

- **Exit codes.** `0` success; `1` an error (one `error:` line on stderr, then a `hint:`
  line; `RLDS_DEBUG=1` shows the traceback instead), a failed check (`inspect --check`,
  `verify`) or a declined confirmation (`rm` answered "n": `kept NAME: nothing was removed`);
  `2` a usage error (unknown command or option, a missing or malformed argument: click's
  message, no hint); `130` interrupted (Ctrl-C), `143` terminated (SIGTERM: `kill`, `timeout`,
  SLURM), with nothing published and no temporary file left (a publish, one rename, is never
  cut: one interrupted after it says what it published; an interrupted `push` says the remote
  holds the earlier version or the new one whole: its commit may have landed before the answer
  came back). A reader that closes the pipe early (`rlds list -q | head -1`) ends the
  output, not the command: the rest goes nowhere and the exit code is the command's own.
- **Options every command has.** `-h/--help`; `--json` (one JSON document on stdout, nothing
  else there; strict JSON: a number that is not finite, NaN or infinity, is `null`);
  `-q/--quiet` (only the names or paths the command lists, creates or removes, one per line:
  `list` the names, `list --remote` and `info` the ids, `download`/`demo`/`preprocess`/
  `view`/`split` the new dataset's name, `rm` the removed names, `gc` the removed paths, `export`
  and `path` the path, `score` the normalized scores; `inspect`, `verify` and `du` print nothing
  and keep their exit status);
  `-v/--verbose` (`-v` info, `-vv` debug, on stderr), before or after the command name;
  `--root DIR` (the cache; default `$RLDS_HOME`, else the user cache directory).
- **Names.** A command that makes a dataset takes its name as `--name/-n` (`split`: the base of
  `NAME-train` and `NAME-val`). A command that reads one takes a cache name or a registry id or
  alias (`rlds inspect demo`): a name in the cache wins, else the registry entry's cache name
  (`rlds_cli.resolve_name`, used by every command).
- **Short options.** `-f` is `--force` (replace what exists), `-n` `--name`, `-q` `--quiet`,
  `-v` `--verbose`, `-h` `--help`, `-y` `--yes`; `--format` has no short form.
- **Storage.** `--storage memmap|zarr` is how a new dataset is stored (`download`, `demo`,
  `preprocess`); `preprocess --executor local|ray` is where its chunks run.
- **Output.** Results go to stdout, messages (errors, warnings, progress, notes) to stderr. On a
  terminal tables never cut a name or id: other columns fold, and optional ones are left out
  (with a note) when the terminal is narrow; elsewhere (a pipe, a file, CI logs) tables are
  plain, complete, aligned lines. Colours follow `NO_COLOR`; glyphs fall back to ASCII when
  the output encoding cannot show them (`PYTHONIOENCODING=ascii`). Warnings and log lines carry
  no source file or line.
- **Files you name.** `show -o`, `show --rerun`, `inspect --plot` and `stats
  --normalization-table` write their file whole (a temporary file, renamed), never inside the
  cache's own folders, and over an existing file only where an earlier run of the command wrote
  it (a page's generator tag, a plot's creator, a table's format, a rerun recording's header):
  any other file there is refused and kept. `export` replaces an existing target only with
  `--force`, and only an earlier export.
- **Threads.** numpy's OpenBLAS starts one thread in rlds's own process unless
  `OPENBLAS_NUM_THREADS` is set (its pool of a thread per core costs ~50 ms of CPU at start-up,
  and no command's work is BLAS); `preprocess` leaves the variable as you set it for your function.
- **Sizes** are disk use: allocated blocks (as `du` counts them), so a sparse file counts what
  it holds. A dataset shows one size everywhere: `rlds list`, the first line of `rlds inspect`
  ("on disk"), `rlds du`, `rm` and `gc`. Only `inspect`'s per-key `bytes` column counts file
  lengths (what the codec wrote, so a zarr key's ratio is its compression), and a dataset read
  at a URL shows the bytes of its files on the store. In `rlds list --remote` the size is the
  download; `-` is a figure nobody publishes (known after the first download) and `~` a rounded
  figure an upstream publishes (`rlds info ID` says where).
"""


def _help(args: list[str]) -> str:
    """``rlds ARGS --help`` as a fixed-width plain-text page."""
    from typer.testing import CliRunner

    result = CliRunner().invoke(
        app, [*args, "--help"], prog_name="rlds", terminal_width=WIDTH, max_content_width=WIDTH
    )
    if result.exit_code != 0:  # pragma: no cover - a broken command definition
        raise RuntimeError(f"'rlds {' '.join(args)} --help' failed: {result.output}")
    return result.stdout.rstrip() + "\n"


def command_names() -> list[str]:
    """The registered commands, in the order ``rlds --help`` lists them."""
    return [c.name or c.callback.__name__ for c in app.registered_commands if not c.hidden]  # type: ignore[union-attr]


def render() -> str:
    """The whole reference page as markdown."""
    parts = [HEADER, "## rlds\n", "```text", _help([]).rstrip(), "```\n"]
    for name in command_names():
        parts += [f"## rlds {name}\n", "```text", _help([name]).rstrip(), "```\n"]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    """Write the page to the path given (default: stdout)."""
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if args:
        Path(args[0]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
