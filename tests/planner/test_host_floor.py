"""The host's floor under an eager decoder's actions: a block's aten operators, counted by running it on the CPU
(models/op_count.py), times the host's cost of one (Card.op_host_s); an action lasts at least that long."""
from __future__ import annotations

import dataclasses

import pytest

from hybrid_engine.planner import CARDS
from hybrid_engine.planner.candidates import Plan
from hybrid_engine.planner.model_shape import shape_of
from hybrid_engine.planner.setting import Setting
from hybrid_engine.planner.step_time import stage_costs
from hybrid_engine.train.cli import parse_config

H200 = CARDS["h200"]
LLAMA = ("--model llama --hidden 2048 --layers 4 --heads 32 --kv-heads 8 --ffn-hidden 5632 --seq-len 2048 "
         "--vocab-size 32000 --batch-size 8 --amp bf16 --plan-card h200 --cuda-graphs off").split()
GPT = "--model gpt --hidden 2048 --layers 4 --heads 16 --seq-len 2048 --batch-size 8 --amp bf16 --plan-card h200".split()


@pytest.fixture(autouse=True)
def gpt_vocabulary(monkeypatch):
    monkeypatch.setattr("hybrid_engine.models.gpt.workload.data_vocab", lambda path, seq_len: 32000)


def block_ops(flags: list[str]) -> tuple[int, int, int]:
    return shape_of(parse_config(flags)).layers[1].host_ops


def test_an_unfused_llama_block_dispatches_more_than_twice_the_gpts_operators():
    llama, gpt = block_ops(LLAMA + ["--mp", "2"]), block_ops(GPT + ["--mp", "2"])
    assert llama[0] > 2 * gpt[0] and llama[1] > 2 * gpt[1]
    for forward, backward, without_weights in (llama, gpt):
        assert 0 < without_weights < backward  # deferring the weight gradients leaves fewer to the backward


def test_a_block_of_compiled_regions_is_not_counted():
    # one GPU on an H200: --fused-kernels auto makes RMSNorm, RoPE and SwiGLU compiled regions
    assert block_ops(LLAMA) == (0, 0, 0)
    assert block_ops(LLAMA + ["--fused-kernels", "off"])[0] > 0


def test_a_host_bound_action_lasts_its_operators_times_the_cost_of_one():
    flags = LLAMA + ["--mp", "4", "--fused-kernels", "off"]
    cfg = parse_config(flags)
    shape = shape_of(cfg)
    setting, plan = Setting.of(cfg, 1, 1, 4), Plan("1f1b", 8)  # one sequence a micro-batch, a quarter of a block
    costs = stage_costs(shape, H200, setting, plan)[0][0]
    blocks = sum(1 for layer in shape.layers if layer.host_ops[0])
    forward_ops = shape.layers[1].host_ops[0]
    assert costs.F >= blocks * forward_ops * H200.op_host_s
    unbound = stage_costs(shape, dataclasses.replace(H200, op_host_s=0.0), setting, plan)
    assert costs.F > unbound[0][0].F
