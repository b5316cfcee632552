"""``rlds score``: episode returns as D4RL normalized scores (the library's
:func:`rlds_cli.normalized_score`)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rlds_cli.cli import output
from rlds_cli.cli.exits import handle_errors
from rlds_cli.cli.options import JsonOption, QuietOption, RootOption, VerboseOption


@handle_errors
def score(
    name: Annotated[str, typer.Argument(help="A registry id (hopper-medium-v2), a cache name or an alias.")],
    returns: Annotated[
        list[float], typer.Argument(help="Undiscounted episode returns to normalize.", show_default=False)
    ],
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Normalize episode returns: 100 * (return - ref_min) / (ref_max - ref_min).

    The reference scores are D4RL's (from the registry: no download needed) or a Minari
    dataset's own (ref_min_score, ref_max_score: download it first). With -q only the scores
    are printed, one per line. Negative returns go after --.

    Example: rlds score hopper-medium-v2 1000 2500.5; rlds score pendulum -- -300
    """
    from rlds_cli.inspection.scores import reference_scores

    ref = reference_scores(name, root)
    scores = [float(ref.normalize(r)) for r in returns]
    if json:
        output.print_json({"name": name, "reference_scores": ref.to_dict(), "returns": returns,
                            "normalized_scores": scores})  # fmt: skip
        return
    if quiet:
        sys.stdout.write("".join(f"{s:.6g}\n" for s in scores))
        return
    out = output.console
    out.print(output.escape(
        f"{name}: reference scores min {ref.min:.6g}, max {ref.max:.6g} (from {ref.origin})"
    ), soft_wrap=True)  # fmt: skip
    for r, s in zip(returns, scores, strict=True):
        out.print(f"return {r:.6g}  ->  normalized score {s:.2f}")
