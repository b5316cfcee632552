"""benchmarks/_harness.py, the harness every benchmark section uses: its rounds, paired ratios and
report pieces on stand-in calls, and sections run end to end in their smallest configuration
(they must still produce their table; the figures themselves are not checked)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
pytest.importorskip("torch")

import _harness


def _cases(n: int = 2) -> list[_harness.Case]:
    calls = [0] * n

    def call(i: int) -> None:
        calls[i] += 1

    return [_harness.Case(f"k{i}", f"case {i}", lambda i=i: call(i)) for i in range(n)]


@pytest.mark.parametrize("how", [{}, {"per_visit": True}, {"budget": True}])
def test_a_round_gives_every_case_one_rate_and_its_faults(how: dict[str, bool]) -> None:
    cases = _cases()
    _harness.rounds(cases, 2, 0.001, lambda _: None, settle=1, calls=3, **how)
    for case in cases:
        assert len(case.rates) == 2 and all(r > 0 for r in case.rates)
        assert len(case.faults) == 2 and all(f >= 0 for f in case.faults)
        assert case.fmt().count("(") == 1 and "-" in case.fmt()


def test_paired_ratios_are_kept_per_round_for_the_pairs_present() -> None:
    cases = {c.key: c for c in _cases(3)}
    out = _harness.measure_pairs(cases, [("k0", "k1"), ("k0", "missing")], 3, 0.001, lambda _: None)
    assert list(out) == [("k0", "k1")]
    assert len(out["k0", "k1"]) == 3 and all(v > 0 for v in out["k0", "k1"])


def test_report_pieces() -> None:
    assert _harness.table(["a", "b"], [[1, "x"], "| raw | line |"]) == [
        "| a | b |",
        "|---|---|",
        "| 1 | x |",
        "| raw | line |",
    ]
    assert _harness.span([1.0, 3.0, 2.0], ".1f", "x") == "2.0x (1.0-3.0)"
    assert _harness.pairs("a/b c-d/e") == [("a", "b"), ("c-d", "e")]
    assert _harness.verdict(True) == "**met**" and _harness.verdict(False) == "**not met**"
    start, end = _harness.markers("s")
    assert _harness.opening("s", "Title", True)[0] == start
    assert any("Quick run" in line for line in _harness.opening("s", "Title", True))
    assert not any("Quick run" in line for line in _harness.opening("s", "Title", False))
    closing = _harness.closing("s", "cmd", ["- note"])
    assert closing[-2] == end and "cmd" in closing and "- note" in closing


def test_the_report_tables_judge_goals_on_the_pairs_except_against_torchrl() -> None:
    cases = {c.key: c for c in _cases(3)}
    cases["trl-x"] = cases.pop("k2")
    cases["trl-x"].key = "trl-x"
    for case, rate in zip(cases.values(), [2.0, 4.0, 1.0], strict=True):
        case.rates = [rate]
    goals = _harness.ratio_goals("k0/k1>=0.9 k0/trl-x>=1.5 k1/k0")
    assert goals == {("k0", "k1"): 0.9, ("k0", "trl-x"): 1.5, ("k1", "k0"): None}
    paired = {("k0", "k1"): [0.9, 1.0, 0.95], ("k0", "trl-x"): [1.0]}
    lines = _harness.ratios_table(cases, goals, paired)
    rows = {line.split(" | ")[0].strip("| "): line for line in lines if line.startswith("| k")}
    mine = rows["k0 / k1"]
    assert "0.50x" in mine and "0.95x (0.90-1.00)" in mine and "**met**" in mine  # the pairs, not the rates
    assert "2.00x" in rows["k0 / trl-x"] and "**met**" in rows["k0 / trl-x"]  # the rates, not the pairs
    assert rows["k1 / k0"].endswith("| - |")
    table = _harness.rates_table(cases.values(), {"extra": lambda c: c.key.upper()})
    assert table[0].endswith("| extra |")
    assert table[2].startswith("| k0 | case 0 | 2.00 (2.00-2.00) | 500 |") and table[2].endswith("| K0 |")


def test_a_section_is_replaced_between_its_markers(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    start, end = _harness.markers("s")
    _harness.write_section(doc, "s", f"{start}\nfirst\n{end}\n")
    doc.write_text(doc.read_text() + "after\n")
    _harness.write_section(doc, "s", f"{start}\ntwo\n{end}\n")
    text = doc.read_text()
    assert text.startswith(_harness.INTRO) and text.endswith("after\n")
    assert "two" in text and "first" not in text


def test_raw_figures_are_saved_as_json(tmp_path: Path) -> None:
    case = _cases(1)[0]
    case.rates = [1.5]
    _harness.save_json(
        tmp_path / "r.json", {"sampling": [case], "pairs": {("a", "b"): [0.9]}, "path": tmp_path}
    )
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["sampling"][0]["rates"] == [1.5] and "fn" not in saved["sampling"][0]
    assert saved["pairs"] == {"a / b": [0.9]} and saved["path"] == str(tmp_path)


@pytest.mark.slow
def test_the_frame_stack_section_runs_in_its_smallest_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import before_after_bench

    doc = tmp_path / "bench.md"
    argv = ["--quick", "--steps", "300", "--seconds", "0.01", "--repeats", "1", "--work", str(tmp_path / "w")]
    assert before_after_bench.main([*argv, "--write", str(doc)]) == 0
    section = doc.read_text()
    for label in (
        "raw `np.take` of 4x the frames, `np.memmap`",
        "`FrameStack(4)` now",
        "`FrameStack(4)` before",
    ):
        assert label in section
    assert "### Goal" in section and _harness.markers("frame-stack")[1] in section
    assert not (tmp_path / "w" / "root").exists()  # generated data removed without --keep


@pytest.mark.slow
def test_the_zarr_section_runs_in_its_smallest_configuration(tmp_path: Path) -> None:
    import zarr_bench

    doc = tmp_path / "bench.md"
    argv = [
        "--quick",
        "--pixel-steps",
        "200",
        "--lowdim-steps",
        "2000",
        "--seconds",
        "0.01",
        "--repeats",
        "1",
    ]
    assert zarr_bench.main([*argv, "--work", str(tmp_path / "w"), "--write", str(doc)]) == 0
    section = doc.read_text()
    assert "| pixels |" in section and "| lowdim |" in section
    assert "zarr, layout before, zarr indexing (before this change)" in section
    assert section.count("**met**") + section.count("**not met**") == 4  # one verdict a goal


@pytest.mark.slow
def test_the_tensordict_section_runs_in_its_smallest_configuration(tmp_path: Path) -> None:
    pytest.importorskip("tensordict")
    import tensordict_bench

    doc = tmp_path / "bench.md"
    argv = ["--quick", "--steps", "2000", "--seconds", "0.01", "--repeats", "1"]
    assert tensordict_bench.main([*argv, "--work", str(tmp_path / "w"), "--write", str(doc)]) == 0
    section = doc.read_text()
    for label in tensordict_bench.CONFIGS.values():
        assert f"| {label} |" in section
    assert section.count("**met**") + section.count("**not met**") == 1  # the one goal, judged
    assert _harness.markers("tensordict")[1] in section
    assert not (tmp_path / "w" / "root").exists()  # generated data removed without --keep
