"""The docs built from code stay current, and the README's links resolve."""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from pathlib import Path

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _cli_reference():  # type: ignore[no-untyped-def]
    return load_script("cli_reference")


def test_cli_reference_is_current() -> None:
    page = ROOT / "docs" / "cli.md"
    assert page.read_text(encoding="utf-8") == _cli_reference().render(), (
        "docs/cli.md is stale: run 'python scripts/cli_reference.py docs/cli.md'"
    )


def test_cli_reference_covers_every_command() -> None:
    script = _cli_reference()
    text = script.render()
    for name in script.command_names():
        assert f"## rlds {name}\n" in text


def test_readme_and_docs_links_resolve() -> None:
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_readme_opens_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    block = lines[lines.index("```bash") + 1 : lines.index("```bash") + 3]
    assert block[0].startswith("make demo") and block[1].startswith("make test")


def test_torchrl_extra_installs_torchrl_and_tensordict() -> None:
    """The ``torchrl`` extra brings both packages the TorchRL interop imports, in ranges the
    installed (tested) versions satisfy."""
    from importlib.metadata import version

    from packaging.requirements import Requirement

    with open(ROOT / "pyproject.toml", "rb") as fh:
        extra = tomllib.load(fh)["project"]["optional-dependencies"]["torchrl"]
    requirements = {r.name: r for r in map(Requirement, extra)}
    assert set(requirements) == {"torchrl", "tensordict"}
    for name, requirement in requirements.items():
        assert requirement.specifier.contains(version(name)), (name, str(requirement.specifier))


def test_readme_registry_figure_is_the_registrys() -> None:
    """ "The registry knows N datasets" in the README is the packaged registry's number of ids
    (one dataset each, aliases not counted), the figure ``rlds list --remote`` opens with; the
    per-file counts of docs/downloads.md add up to it."""
    from typer.testing import CliRunner

    from rlds_cli.catalog import registry
    from rlds_cli.cli.app import app

    ids = [e.id for e in registry.entries()]
    assert len(ids) == len(set(ids))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    figure = re.search(r"The registry knows ([\d,]+) datasets", readme)
    assert figure, "README.md no longer says how many datasets the registry knows"
    assert int(figure.group(1).replace(",", "")) == len(ids)
    listing = CliRunner().invoke(app, ["list", "--remote"])
    assert listing.exit_code == 0
    assert listing.stdout.splitlines()[0] == f"{len(ids)} dataset(s) in the registry"
    table = re.findall(r"^\| `(\w+\.toml)` \| (\d+) \|", (ROOT / "docs" / "downloads.md").read_text(), re.M)
    by_file = Counter(Path(entry.origin).name for entry in registry.entries())
    assert {name: int(n) for name, n in table} == by_file
