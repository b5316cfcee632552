"""The one block packer of the readers (rlds_cli/formats/base.py): pieces of episodes in, TED
blocks out, with each episode's end marked once and the budget held."""

from __future__ import annotations

import numpy as np
import pytest

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import (
    BLOCK_BYTES,
    BlockPacker,
    ConversionReport,
    EpisodeSchema,
    Piece,
    StepBlock,
    piece_block,
    rows_per_block,
)


def piece(first: int, steps: int, *, last: bool = True, episode: int = 0, **kw: object) -> Piece:
    """``steps`` steps numbered from ``first``; the final observation is ``-first`` when ``last``."""
    obs = np.arange(first, first + steps, dtype=np.float32)
    if last:
        obs = np.append(obs, -first)
    return Piece(
        f"ep{episode}",
        {"observation": obs[:, None]},
        {"action": np.arange(first, first + steps, dtype=np.float32)[:, None],
         "next/reward": np.ones((steps, 1), np.float32)},
        kw.pop("terminated", True),  # type: ignore[arg-type]
        source_id=episode,
        last=last,
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def pack(packer: BlockPacker, pieces: list[Piece]) -> list[StepBlock]:
    out = [b for p in pieces for b in packer.add(p)]
    return out + list(packer.finish())


def test_pieces_of_episodes_become_blocks_with_each_end_marked_once() -> None:
    # episode 7: 3 + 2 steps in two pieces, terminated; episode 8: 4 steps, truncated, final unknown
    pieces = [
        piece(0, 3, last=False, episode=7),
        piece(3, 2, episode=7),
        piece(10, 4, episode=8, terminated=False, final_known=False),
    ]
    (block,) = pack(BlockPacker(), pieces)
    assert block.num_steps == 9
    assert block.ends.tolist() == [4, 8]
    assert block.steps["action"][:, 0].tolist() == [0, 1, 2, 3, 4, 10, 11, 12, 13]
    # the flat layout: each episode's final observation right after its last step
    assert block.observations["observation"][:, 0].tolist() == [0, 1, 2, 3, 4, -3, 10, 11, 12, 13, -10]
    assert block.steps["next/terminated"][:, 0].tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0]
    assert block.steps["next/truncated"][:, 0].tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 1]
    assert block.final_known is not None and block.final_known.tolist() == [True, False]
    assert block.episode_ids is not None and block.episode_ids.tolist() == [7, 8]


def test_a_step_may_carry_both_flags_when_the_source_says_so() -> None:
    block = piece_block(piece(0, 2, terminated=True, truncated=True))
    assert block.steps["next/terminated"][-1, 0] and block.steps["next/truncated"][-1, 0]


def test_the_row_budget_cuts_blocks_and_a_full_piece_is_passed_on_without_a_copy() -> None:
    big = piece(100, 4, episode=2)
    blocks = pack(BlockPacker(block_rows=4), [piece(0, 1, episode=1), big, piece(200, 2, episode=3)])
    assert [b.num_steps for b in blocks] == [1, 4, 2]  # the pending piece goes out before the big one
    assert blocks[1].steps["action"] is big.steps["action"]  # a block of one piece is that piece


def test_the_byte_budget_cuts_blocks() -> None:
    pieces = [piece(10 * i, 5, episode=i) for i in range(6)]
    per_piece = piece_block(pieces[0])
    nbytes = sum(v.nbytes for v in (*per_piece.steps.values(), *per_piece.observations.values()))
    blocks = pack(BlockPacker(block_bytes=2 * nbytes), pieces)
    assert [b.num_steps for b in blocks] == [10, 10, 10]
    ids = [b.episode_ids for b in blocks if b.episode_ids is not None]
    assert np.concatenate(ids).tolist() == list(range(6))


def test_blocks_without_per_end_arrays_mix_with_pieces() -> None:
    """A reader's own block (V-D4RL's stitched chunks) carries no final_known/episode_ids."""
    own = StepBlock(
        steps=dict(piece_block(piece(0, 2)).steps),
        observations={"observation": np.zeros((3, 1), np.float32)},
        ends=np.array([1]),
    )
    packer = BlockPacker()
    assert list(packer.add_block(own)) == []
    (block,) = pack(packer, [piece(5, 2, episode=9)])
    assert block.ends.tolist() == [1, 3]
    assert block.final_known is not None and block.final_known.tolist() == [True, True]
    assert block.episode_ids is not None and block.episode_ids.tolist() == [-1, 9]


def test_an_empty_last_piece_is_refused_and_an_empty_middle_one_skipped() -> None:
    packer = BlockPacker()
    assert list(packer.add(piece(0, 0, last=False))) == []
    assert list(packer.finish()) == []
    with pytest.raises(ValueError, match="ep4: an episode's last piece has no step"):
        list(packer.add(Piece("ep4", {"observation": np.zeros((1, 1))}, {"action": np.zeros((0, 1))}, True)))


def test_the_schema_check_drops_empty_episodes_and_refuses_mixed_shapes() -> None:
    report = ConversionReport()
    packer = BlockPacker(admit=EpisodeSchema(report))
    no_step = {"action": np.zeros((0, 1), np.float32)}
    empty = Piece("e0", {"observation": np.zeros((1, 1), np.float32)}, no_step, True)
    assert list(packer.add(empty)) == [] and report.dropped_episodes == 1
    list(packer.add(piece(0, 2, episode=1)))
    wide = piece(0, 2, episode=2)
    wide.steps["action"] = np.zeros((2, 3), np.float32)
    with pytest.raises(SourceFormatError, match="ep2: 'action' has shape \\(3,\\)"):
        list(packer.add(wide))


def test_rows_per_block_is_the_byte_budget_within_the_readers_bounds() -> None:
    assert rows_per_block(1024) == BLOCK_BYTES // 1024
    assert rows_per_block(BLOCK_BYTES * 4) == 1  # a row larger than the budget: one row a block
    assert rows_per_block(1, 64, 1 << 16) == 1 << 16
    assert rows_per_block(BLOCK_BYTES, 64, 1 << 16) == 64
