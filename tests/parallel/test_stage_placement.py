"""Stage placement is one C++ function (csrc/schedule/placement.h), bound to Python; nothing else computes which
pipeline rank runs a stage."""
import pathlib
import re

import pytest

import hybrid_engine._C as _C
from hybrid_engine.parallel.grid import pipeline_channel_pairs
from hybrid_engine.parallel.pipeline.partition import stages_of_rank
from hybrid_engine.parallel.pipeline.schedule import (add_communication, compute_schedule, rank_stages,
                                                      schedule_placement, simulate, stage_rank, validate)

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("pp,v", [(1, 1), (1, 3), (2, 1), (2, 2), (3, 2), (4, 3)])
def test_loop_placement_is_stage_mod_pp(pp, v):
    n = pp * v
    assert [stage_rank(s, pp, n) for s in range(n)] == [s % pp for s in range(n)]
    assert [rank_stages(r, pp, n, "loop") for r in range(pp)] == [list(range(r, n, pp)) for r in range(pp)]
    assert [stages_of_rank(r, pp, v) for r in range(pp)] == [list(range(r, n, pp)) for r in range(pp)]


@pytest.mark.parametrize("pp", [1, 2, 3, 4])
def test_v_placement_pairs_stage_s_with_its_mirror(pp):
    n = 2 * pp
    assert [stage_rank(s, pp, n, "v") for s in range(n)] == list(range(pp)) + list(reversed(range(pp)))
    assert [rank_stages(r, pp, n, "v") for r in range(pp)] == [[r, n - 1 - r] for r in range(pp)]


@pytest.mark.parametrize("call,message", [
    (lambda: stage_rank(0, 2, 6, "v"), "the v placement puts exactly two stages on each rank, so it needs 2 x pp "
                                       "stages (got pp=2, stages=6)"),
    (lambda: stage_rank(4, 2, 4), "stage 4 is outside 0..3"),
    (lambda: stage_rank(0, 3, 4), "the number of stages must be a positive multiple of pp (got pp=3, stages=4)"),
    (lambda: rank_stages(2, 2, 4, "v"), "pipeline rank 2 is outside 0..1"),
    (lambda: stage_rank(0, 2, 4, "zigzag"), "unknown stage placement 'zigzag' (expected loop or v)"),
])
def test_bad_placements_are_one_clear_line(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value) == message


def test_every_schedule_says_its_placement():
    assert {name: schedule_placement(name) for name in _C.schedule.schedule_names()} == {
        **dict.fromkeys(("naive", "gpipe", "1f1b", "interleaved", "zb1"), "loop"), "zbv": "v", "dualpipev": "v"}
    with pytest.raises(ValueError, match="unknown schedule 'zigzag'"):
        schedule_placement("zigzag")


def test_a_v_program_lowers_with_a_local_turn_and_simulates():
    """pp=2, stages 0 1 2 3 on ranks 0 1 1 0: the hop 1 -> 2 stays on rank 1 (no message), and the loop placement
    refuses the same program."""
    loop = compute_schedule("gpipe", 2, 2, 2)  # a program to rename: its stage order per rank is r, r + 2
    v_stage = {0: 0, 2: 3, 1: 1, 3: 2}  # rank 0 runs 0 and 3, rank 1 runs 1 and 2, in the same chunk order
    program = [[_C.schedule.Action(v_stage[a.stage], a.type, a.micro) for a in actions] for actions in loop]
    lowered = add_communication(program, 4, "v")
    messages = [str(a) for actions in lowered for a in actions if not a.is_compute]
    assert not any(m.startswith(("1SEND_F", "2RECV_F", "2SEND_B", "1RECV_B")) for m in messages), messages
    assert len(messages) == 16  # hops 0 -> 1 and 2 -> 3, both ways, 2 micro-batches, a send and a receive each
    validate(lowered, placement="v")
    assert simulate(lowered, placement="v").makespan > 0
    with pytest.raises(ValueError, match="stage 3 belongs to rank 1 \\(loop placement\\)"):
        validate(lowered)


def test_channels_cover_every_hop_of_every_placement():
    """The ring the loop placement needs (neighbours both ways, and the last rank back to the first)."""
    for pp in range(1, 6):
        ring = {(r, d) for r in range(pp) for d in ((r + 1) % pp, (r - 1) % pp) if d != r}
        assert set(pipeline_channel_pairs(pp)) == ring, pp
        for placement in ("loop", "v"):
            ranks = [stage_rank(s, pp, 2 * pp, placement) for s in range(2 * pp)]
            assert {(a, b) for a, b in zip(ranks, ranks[1:]) if a != b} <= ring


# Ways of computing a stage's rank by hand: a stage index modulo the pipeline size, a chunk times pp plus a rank,
# a range from a rank stepping by pp, and the first / last pipeline rank taken for the first / last stage.
_PP = r"(?:\w+\.)*(?:pp|pp_size|pipeline_size)\b"
_STAGE = r"(?:\b(?:s|st|stage\w*|\w+\.stage)|\(\s*(?:s|st|stage\w*|\w+\.stage)\s*[-+]\s*1\s*\))"
STAGE_ARITHMETIC = [
    re.compile(_STAGE + r"\s*%\s*" + _PP),
    re.compile(r"\b(?:c|chunk\w*)\s*\*\s*" + _PP + r"\s*\+\s*(?:r|rank|pp_rank)\b"),
    re.compile(r"\b(?:r|rank|pp_rank)\s*\+\s*(?:c|chunk\w*)\s*\*\s*" + _PP),
    re.compile(r"range\(\s*(?:r|rank|pp_rank)\s*,[^()]*,\s*" + _PP + r"\s*\)"),
    re.compile(r"pp_ranks\[\s*(?:0|-1)\s*\]"),
    re.compile(r"\bstage_owner\("),
]
PLACEMENT_FILES = {"csrc/schedule/placement.cpp"}


@pytest.mark.parametrize("snippet", [
    "owner = s % pp_size", "if s > 0 and owner != (s - 1) % pp_size:", "out[stage % s.pp] += 1",
    "schedule[r].push_back({c * pp + r, ActionType::F, k});", "return [pp_rank + chunk * pp_size for chunk in x]",
    "sum(merged[st] for st in range(r, stages, s.pp))", "members = sorted({pp_ranks[0], pp_ranks[-1]})",
    "inline int stage_owner(int stage, int pp) { return stage % pp; }",
])
def test_the_scan_catches_hand_placement(snippet):
    assert any(p.search(snippet) for p in STAGE_ARITHMETIC), snippet


def test_no_file_but_the_placement_computes_a_stages_rank():
    found = []
    for folder, suffixes in (("hybrid_engine", {".py"}), ("csrc", {".cpp", ".h"})):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in suffixes or str(path.relative_to(ROOT)) in PLACEMENT_FILES:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("//")[0] if path.suffix != ".py" else line.split("#")[0]
                if any(p.search(code) for p in STAGE_ARITHMETIC):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "stage -> rank computed outside csrc/schedule/placement.cpp:\n" + "\n".join(found)
