"""Action IR: compact printing and parsing, value semantics, and the validator's rules."""
from __future__ import annotations

import pickle

import pytest

from hybrid_engine.parallel.pipeline.schedule import Action, ActionType, add_communication, make_schedule, validate

ALL_TYPES = ["F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B"]


def acts(text: str) -> list[Action]:
    return [Action.parse(t) for t in text.split()]


@pytest.mark.parametrize("type_name", ALL_TYPES)
@pytest.mark.parametrize("stage,micro", [(0, 0), (1, 3), (12, 31), (7, 100)])
def test_action_prints_compactly_and_parses_back(type_name, stage, micro):
    action = Action(stage, getattr(ActionType, type_name), micro)
    text = f"{stage}{type_name}{micro}"
    assert str(action) == text
    assert repr(action) == text
    assert Action.parse(text) == action
    assert (action.stage, action.type, action.micro) == (stage, getattr(ActionType, type_name), micro)


def test_action_compares_and_hashes_by_value():
    a, b = Action.parse("1F3"), Action(1, ActionType.F, 3)
    assert a == b and hash(a) == hash(b)
    assert len({a, b, Action.parse("1B3")}) == 2
    assert a != Action.parse("1F4") and a != "1F3"
    assert pickle.loads(pickle.dumps(Action.parse("0SEND_B2"))) == Action.parse("0SEND_B2")


def test_action_type_knows_compute_from_communication():
    assert [t for t in ALL_TYPES if getattr(ActionType, t).is_compute] == ["F", "B", "I", "W"]
    assert Action.parse("2RECV_B1").is_compute is False
    assert ActionType.parse("SEND_F") == ActionType.SEND_F


@pytest.mark.parametrize("text,why", [
    ("", "no stage number"),
    ("F3", "no stage number"),
    ("1F", "no micro-batch number"),
    ("13", "no action type"),
    ("1X3", "unknown action type 'X'"),
    ("1 F3", "unknown action type ' F'"),
    ("-1F3", "no stage number"),
    ("99999999999F1", "number too large"),
])
def test_action_parse_rejects_malformed_text_naming_it(text, why):
    with pytest.raises(ValueError) as err:
        Action.parse(text)
    assert f"'{text}'" in str(err.value) and why in str(err.value)


# validate(): one broken program per rule; the message names the rank and the action.
GOOD_1F1B = "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 | 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"


def program(text: str) -> list[list[Action]]:
    return [acts(rank) for rank in text.split("|")]


def test_validate_accepts_the_lowered_1f1b_program():
    assert program(GOOD_1F1B) == make_schedule("1f1b", 2, 2)
    validate(program(GOOD_1F1B))


@pytest.mark.parametrize("broken,message", [
    # a stage on a rank that does not own it
    (GOOD_1F1B.replace("0F1 0SEND_F1", "0F1 1F1 0SEND_F1"), "rank 0, action #3 (1F1): stage 1 belongs to rank 1"),
    # backward before its own forward
    ("0B0 0F0 0SEND_F0 0RECV_B0 | 1RECV_F0 1F0 1B0 1SEND_B0", "rank 0, action #0 (0B0): needs 0F0 earlier"),
    # send before the compute that produces the tensor
    (GOOD_1F1B.replace("0F1 0SEND_F1", "0SEND_F1 0F1"), "rank 0, action #2 (0SEND_F1): sent before the compute"),
    # receive posted after its consumer
    (GOOD_1F1B.replace("1RECV_F1 1F1", "1F1 1RECV_F1"), "rank 1, action #4 (1F1): needs 1RECV_F1 earlier"),
    # an action listed twice
    (GOOD_1F1B.replace("1B1 1SEND_B1", "1B1 1B1 1SEND_B1"), "rank 1, action #7 (1B1): already listed at action #6"),
    # a micro-batch that never goes backward on stage 0
    (GOOD_1F1B.replace("0RECV_B1 0B1", "0RECV_B1"), "rank 0 is missing 0B1"),
    # a gradient that is never sent back
    (GOOD_1F1B.replace("1B1 1SEND_B1", "1B1"), "rank 1 is missing 1SEND_B1"),
    # a receive of a tensor that stays on the rank
    (GOOD_1F1B.replace("0F0 0SEND_F0", "0RECV_F0 0F0 0SEND_F0"), "rank 0, action #0 (0RECV_F0): no other rank sends"),
    # out of range
    (GOOD_1F1B.replace("0F1 0SEND_F1", "0F1 0SEND_F1 2F0"), "stage out of range 0..1"),
])
def test_validate_names_the_rank_and_action_of_a_broken_program(broken, message):
    with pytest.raises(ValueError) as err:
        validate(program(broken), micro_batches=2, num_stages=2)
    assert message in str(err.value)


def test_validate_orders_i_before_w_and_requires_both():
    good = make_schedule("zb1", 2, 2)
    validate(good)
    w_first = [list(rank) for rank in good]
    i, w = w_first[1].index(Action.parse("1I0")), w_first[1].index(Action.parse("1W0"))
    w_first[1][i], w_first[1][w] = w_first[1][w], w_first[1][i]
    with pytest.raises(ValueError, match=r"rank 1, action #\d+ \(1W0\): needs 1I0 earlier"):
        validate(w_first)
    no_w = [[a for a in rank if str(a) != "0W1"] for rank in good]
    with pytest.raises(ValueError, match="rank 0 is missing 0W1: every I needs its W"):
        validate(no_w)


def test_validate_rejects_receives_posted_out_of_the_senders_order():
    # Rank 1 posts the receive of micro-batch 1 before micro-batch 0's: the channel is FIFO, so micro-batch 0's
    # activation would land in micro-batch 1's buffer.
    swapped = program(GOOD_1F1B.replace("1RECV_F0 1F0", "1RECV_F1 1RECV_F0 1F0").replace("1RECV_F1 1F1", "1F1"))
    with pytest.raises(ValueError) as err:
        validate(swapped)
    text = str(err.value)
    assert "channel rank 0 -> rank 1 (activations)" in text
    assert "sent by rank 0, action #1 (0SEND_F0)" in text and "received by rank 1, action #0 (1RECV_F1)" in text


def test_add_communication_rejects_a_program_that_already_communicates():
    with pytest.raises(ValueError, match="expects compute-only lists"):
        add_communication(make_schedule("1f1b", 2, 2))
