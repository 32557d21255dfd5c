"""Context parallelism's K/V traffic in the cost model (hybrid_engine/planner/context_comm.py): the ring's hops
exposed beyond the block attention they overlap, the all-gather's collectives whole, and the auto rule between them
at the crossover the arithmetic gives."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from hybrid_engine.models.planner_shape import causal_attention_flops
from hybrid_engine.planner.card import ATTENTION_BACKWARD, CARDS
from hybrid_engine.planner.context_comm import (GRAD_BYTES, KvTraffic, all_gather_cost, choose_comm, comm_rule,
                                                ring_cost)
from hybrid_engine.planner.step_time import AUTOGRAD_SLOWDOWN, BLOCK_BYTES

H100 = CARDS["h100"]
HIDDEN, KV_WIDTH = 2048, 2 * 8 * 64  # a Llama-1B-class layer: 32 heads of 64, 8 kv heads
KERNEL = H100.blocks_kernel("auto")  # the blocks' kernel on a Hopper card: SDPA's, cuDNN's


def traffic(cp: int, tokens: int, attention_s: float | None = None) -> KvTraffic:
    """A bf16 Llama-1B-class layer's traffic, one row of `tokens` tokens per rank; attention timed as the planner
    times a decoder's unless given, its blocks by the card's kernel."""
    if attention_s is None:
        flops = causal_attention_flops(cp * tokens, HIDDEN) * tokens
        attention_s = AUTOGRAD_SLOWDOWN * H100.attention_s(flops, True, KERNEL)
    return KvTraffic(cp, tokens, KV_WIDTH, 2, attention_s)


def test_with_nothing_to_hide_under_every_ring_hop_shows():
    for cp in (2, 4, 8):
        t = traffic(cp, 4096, attention_s=0.0)
        kv, grad = H100.hop_s(t.kv_bytes), H100.hop_s(t.grad_bytes)
        cost = ring_cost(H100, t)
        assert cost.forward_s == pytest.approx((cp - 1) * kv)
        assert cost.backward_s == pytest.approx(kv + (cp - 2) * H100.hop_s(t.kv_bytes + t.grad_bytes) + 2 * grad)
    exposed = [ring_cost(H100, traffic(cp, tokens, 0.0)).exposed_s for cp in (2, 4, 8) for tokens in (1024, 8192)]
    assert exposed[0] < exposed[1] and exposed[0] < exposed[2] < exposed[4]  # grows with the sequence and with cp
    assert ring_cost(H100, traffic(1, 4096, 0.0)).exposed_s == 0.0


def test_blocks_that_outlast_their_hops_hide_all_but_the_last_accumulator():
    t = traffic(4, 32768)
    assert t.block_s > H100.hop_s(t.kv_bytes + t.grad_bytes)  # a 32k-token block's attention outlasts its hop
    cost = ring_cost(H100, t)
    assert cost.forward_s == 0.0
    assert cost.backward_s == pytest.approx(H100.hop_s(32768 * KV_WIDTH * GRAD_BYTES))  # home, after the last block
    # the ring's exposure grows with the sequence, hidden or not; the all-gather's with cp too, hidden never
    assert ring_cost(H100, traffic(4, 65536)).exposed_s > cost.exposed_s
    gathered = all_gather_cost(H100, t)
    assert gathered.forward_s == pytest.approx(H100.collective_s(4 * t.kv_bytes, 4, 1.0))
    assert gathered.backward_s == pytest.approx(gathered.forward_s + H100.collective_s(4 * t.grad_bytes, 4, 1.0))
    assert all_gather_cost(H100, traffic(8, 32768)).exposed_s > gathered.exposed_s


def hidden_from(cp: int) -> float:
    """The tokens per rank from which every ring hop but the last hides: a block's forward attention a s^2 (the
    planner's attention time) outlasts a K/V hop, latency + b s, and its backward (ATTENTION_BACKWARD times) a K/V
    hop with an accumulator beside it; s from a s^2 = latency + b s."""
    a = traffic(cp, 1).block_s  # one token: a
    kv_b = KV_WIDTH * 2 / H100.p2p_bytes_s
    both_b = KV_WIDTH * (2 + GRAD_BYTES) / H100.p2p_bytes_s

    def root(a_: float, b_: float) -> float:
        return (b_ + math.sqrt(b_ * b_ + 4 * a_ * H100.latency_s)) / (2 * a_)

    return max(root(a, kv_b), root(ATTENTION_BACKWARD * a, both_b))


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_auto_takes_the_all_gather_for_short_shares_and_the_ring_once_its_hops_hide(cp):
    """Above hidden_from(cp) the ring exposes one accumulator hop (one latency) against the all-gather's three
    collectives; far below it every one of the ring's 2 cp hops shows its latency against the all-gather's three."""
    s = hidden_from(cp)
    assert 200 < s < 2000  # hundreds of tokens on an H100: the arithmetic's crossover, not a table's
    short, long = int(s / 8), int(s) + 1
    assert choose_comm("auto", H100, traffic(cp, short)).name == "all-gather"
    for tokens in (long, 4 * long, 131072 // cp):
        chosen = choose_comm("auto", H100, traffic(cp, tokens))
        assert chosen.name == "ring" and chosen.ring.exposed_s < chosen.all_gather.exposed_s
    assert choose_comm("ring", H100, traffic(cp, short)).name == "ring"
    assert choose_comm("all-gather", H100, traffic(cp, 131072 // cp)).why == "--cp-comm"


def test_the_choice_says_its_numbers():
    why = choose_comm("auto", H100, traffic(4, 32768)).why
    assert why == ("auto: K/V traffic exposes 0.359 ms a layer and micro-batch against the all-gather's 2.35: a ring "
                   "hop of 64 MiB takes 0.187 ms on the H100 beside 11 ms of a block's attention")


def test_the_engine_asks_the_same_rule_of_its_tensors():
    """The rule the engine applies to a rank's q and k (comm_rule) is the planner's for the same layer."""
    q = torch.empty(1, 32, 8192, 64, dtype=torch.bfloat16, device="meta")
    k = torch.empty(1, 8, 8192, 64, dtype=torch.bfloat16, device="meta")
    for cp in (2, 4):
        assert comm_rule("auto", H100)(q, k, cp, KERNEL) == choose_comm("auto", H100, traffic(cp, 8192))
    slower = dataclasses.replace(H100, compute_scale=2.0)  # a refitted card's slower attention hides more
    assert (comm_rule("auto", slower)(q, k, 4, KERNEL).ring.exposed_s
            <= comm_rule("auto", H100)(q, k, 4, KERNEL).ring.exposed_s)
    # aten's flash kernel is slower on the same blocks: its hops hide behind more
    assert comm_rule("auto", H100)(q, k, 4, "flash").ring.exposed_s <= comm_rule("auto", H100)(q, k, 4,
                                                                                              KERNEL).ring.exposed_s


def test_a_cp_plans_step_pays_the_exposed_kv_traffic_of_every_layer():
    """A Llama-1B-class model at 128k tokens on cp 4 (one pipeline rank, one micro-batch): the step holds each of
    its 16 layers' exposed K/V traffic once, and forcing the all-gather costs exactly the difference, less the
    merges of the blocks it does not run (two blocks a query against the ring's four)."""
    from hybrid_engine.planner.candidates import Plan
    from hybrid_engine.planner.model_shape import shape_of
    from hybrid_engine.planner.setting import Setting
    from hybrid_engine.planner.step_time import step_time
    from hybrid_engine.train.cli import parse_config

    flags = ["--model", "llama", "--layers", "16", "--hidden", "2048", "--heads", "32", "--kv-heads", "8",
             "--ffn-hidden", "5632", "--max-positions", "131072", "--seq-len", "131072", "--batch-size", "1",
             "--amp", "bf16", "--cp", "4"]
    times = {}
    for comm in ("auto", "all-gather"):
        cfg = parse_config(flags + ["--cp-comm", comm])
        times[comm] = step_time(shape_of(cfg), H100, Setting.of(cfg, 1, 1, 1), Plan("1f1b", 1))
    auto, gathered = times["auto"], times["all-gather"]
    assert auto.cp_comm == choose_comm("auto", H100, traffic(4, 32768)) and auto.cp_comm.name == "ring"
    assert auto.cp_exposed_s == pytest.approx(16 * auto.cp_comm.ring.exposed_s)
    assert gathered.cp_exposed_s == pytest.approx(16 * auto.cp_comm.all_gather.exposed_s)
    per_block = sum(BLOCK_BYTES[KERNEL]) * 32768 * HIDDEN / H100.hbm_bytes_s
    merges = AUTOGRAD_SLOWDOWN * (4 - 2) * per_block
    assert gathered.step_s - auto.step_s == pytest.approx(gathered.cp_exposed_s - auto.cp_exposed_s - 16 * merges,
                                                          rel=1e-6)
