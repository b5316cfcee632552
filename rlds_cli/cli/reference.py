"""The CLI reference page (docs/cli.md), generated from the app itself.

``python -m rlds_cli.cli.reference docs/cli.md`` rewrites the page; a test checks that the
committed page equals what the code generates, so the docs cannot drift from the commands.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rlds_cli.cli.app import app

WIDTH = 100
HEADER = """# CLI reference

Generated from the application by `python -m rlds_cli.cli.reference docs/cli.md`; a test
fails when this page and the code disagree. Every command exits 0 on success and 1 on an
error (one `error:` line on stderr, then a `hint:` line); `RLDS_DEBUG=1` shows the traceback.
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
