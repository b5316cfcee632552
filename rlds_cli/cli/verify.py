"""``rlds verify``."""

from __future__ import annotations

from typing import Annotated

import typer

from rlds_cli.cli import output
from rlds_cli.cli.exits import handle_errors
from rlds_cli.cli.options import JsonOption, QuietOption, RootOption, VerboseOption


@handle_errors
def verify(
    name: Annotated[str, typer.Argument(help="A dataset name in the cache, or a registry id.")],
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Check a dataset's source, parent, files and content digests; say what was checked.

    By kind: a download's files against their sha256; a local conversion's source file, when it
    is still there; a view's or preprocessed output's parent (still there, the same version).
    For every dataset: every stored file is complete and every array has the content digest
    recorded when it was written. Exits 1 when a check fails (with -q: only the exit status,
    and the error line); --json lists every check with pass, fail or skipped and why.
    """
    from rlds_cli.sources.verify import verify as run_verify

    report = run_verify(name, root)
    checks = report["checks"]
    if json:
        output.print_json(report)
    elif not quiet:
        esc = output.escape
        for c in checks:
            colour = {"pass": "green", "fail": "red"}.get(c["status"], "yellow")
            output.console.print(
                f"[{colour}]{c['status']:<7}[/] {esc(c['check'])}: {esc(c['detail'])}", soft_wrap=True
            )
    failed = [c for c in checks if c["status"] == "fail"]
    if failed:
        if not json:
            what = ", ".join(c["check"] for c in failed[:3]) + (" ..." if len(failed) > 3 else "")
            output.error(
                f"{report['name']}: verification failed: {len(failed)} of {len(checks)} checks ({what})",
                failed[0].get("hint", ""),
            )
        raise typer.Exit(1)
    if json or quiet:
        return
    passed = sum(c["status"] == "pass" for c in checks)
    skipped = len(checks) - passed
    label = f"{output.escape(report['name'])} ({report['kind']})"
    if not passed:  # never a bare "verified" after checking nothing
        output.console.print(f"[yellow]{label}: nothing could be checked ({skipped} skipped)[/]")
        return
    more = f", {skipped} skipped" if skipped else ""
    output.console.print(f"[green]{label}: verified[/] ({passed} checks passed{more})")
