"""A dataset card's front matter stays YAML whatever text the user gave: a citation or
description with DEL, C1 controls, line or paragraph separators or a byte-order mark reads back
as given (PyYAML refused DEL: "special characters are not allowed")."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlds_cli.cache.card import make_card
from rlds_cli.cache.opening import open_dataset
from rlds_cli.remote.hub_push import readme
from tests.loader_fixtures import make_ted


@pytest.mark.parametrize("odd", ["\x7f", "\x85", "\x9f", "\u2028", "\u2029", "\ufeff", "\x00", '"\\'])
def test_the_front_matter_reads_back_any_citation(isolated_cache: Path, odd: str) -> None:
    yaml = pytest.importorskip("yaml")
    isolated_cache.mkdir(parents=True, exist_ok=True)
    make_ted(isolated_cache, "a", [3, 4])
    citation = f"@misc{{x, title={{A{odd}B}}}}: --- # not a comment"
    text = readme(open_dataset("a").manifest, make_card(license="MIT", citation=citation), "`rlds pull URL`")
    front = text.split("---\n")[1]
    meta = yaml.safe_load(front)
    assert meta["citation"] == citation and meta["license"] == "mit"
