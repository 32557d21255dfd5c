"""Sequence parallelism in the planner's step: each tensor-parallel all-reduce becomes an all-gather and a
reduce-scatter (twice the collectives for the same bytes), and every backward all-reduces the gradients of the
parameters used on a sequence chunk, counted on the model's own plan."""
from __future__ import annotations

import dataclasses

from hybrid_engine.planner import CARDS
from hybrid_engine.planner.candidates import Plan
from hybrid_engine.planner.model_shape import shape_of
from hybrid_engine.planner.setting import Setting
from hybrid_engine.planner.step_time import step_time
from hybrid_engine.train.cli import parse_config

LLAMA = ("--model llama --hidden 256 --layers 4 --heads 8 --kv-heads 2 --ffn-hidden 704 --seq-len 512 --vocab-size "
         "32000 --batch-size 8 --amp bf16 --plan-card h200 --cuda-graphs off --mp 2").split()
GPT = "--model gpt --hidden 256 --layers 4 --heads 8 --seq-len 512 --batch-size 8 --amp bf16 --mp 2".split()


# without the host's floor: a block this small is host-bound, its step the host's whatever its collectives
GPU_BOUND = dataclasses.replace(CARDS["h200"], op_host_s=0.0)


def predicted(flags: list[str], plan: Plan = Plan("1f1b", 4)):
    cfg = parse_config(flags)
    return step_time(shape_of(cfg), GPU_BOUND, Setting.of(cfg, 1, 1, 2), plan)


def test_a_block_counts_the_parameters_its_plan_uses_on_a_sequence_chunk(monkeypatch):
    monkeypatch.setattr("hybrid_engine.models.gpt.workload.data_vocab", lambda path, seq_len: 32000)
    # the GPT: both LayerNorms' weights and biases, both row-parallel biases; the Llama: both RMSNorms' weights
    assert shape_of(parse_config(GPT)).layers[1].sequence_params == 6
    assert shape_of(parse_config(LLAMA)).layers[1].sequence_params == 2


def test_sequence_parallelism_doubles_the_collectives_and_adds_the_parameters_all_reduces():
    plain, sp = predicted(LLAMA), predicted(LLAMA + ["--sequence-parallel"])
    blocks, micro_batches = 4, 4
    assert plain.mp_allreduces == 4 * blocks * micro_batches  # two forward, two backward
    assert sp.mp_allreduces == (8 + 2) * blocks * micro_batches
    assert sp.step_s > plain.step_s and sp.mp_exposed_s > plain.mp_exposed_s
