"""``rlds verify``."""

from __future__ import annotations

from typing import Annotated

import typer

from rlds_cli.cli import _output
from rlds_cli.cli._errors import handle_errors
from rlds_cli.cli.options import JsonOption, QuietOption, RootOption, VerboseOption


@handle_errors
def verify(
    name: Annotated[str, typer.Argument(help="A dataset name in the cache, or a registry id.")],
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Re-hash a dataset's downloaded files and check them against the known or recorded
    sha256 and against the cache manifest. Exits 1 on any mismatch (with -q: only the exit
    status, and the error line)."""
    from rlds_cli.net.status import verify as run_verify

    report = run_verify(name, root)
    if json:
        _output.print_json(report)
    elif not quiet:
        esc = _output.escape
        for f in report["files"]:
            colour = {"ok": "green", "mismatch": "red"}.get(f["status"], "yellow")
            line = f"[{colour}]{f['status']}[/]  {esc(f['name'])}"
            if f["status"] == "mismatch":
                line += f"  sha256 {f['actual']}, expected {f['expected']} ({f['origin']})"
            _output.console.print(line, soft_wrap=True)
        for c in report["manifest"]:
            colour = "green" if c["ok"] else "red"
            line = f"[{colour}]{'ok' if c['ok'] else 'mismatch'}[/]  {esc(c['check'])}"
            if not c["ok"]:
                line += f"  {c['actual']}, expected {c['expected']}"
            _output.console.print(line, soft_wrap=True)
    if not report["ok"]:
        if not json:
            _output.error(
                f"{report['name']}: verification failed",
                "re-download it with 'rlds download ID --force'",
            )
        raise typer.Exit(1)
    if not (json or quiet):
        _output.console.print(f"[green]{_output.escape(report['name'])}: verified[/]")
