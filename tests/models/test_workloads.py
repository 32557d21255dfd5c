"""Workloads and the engine's per-model knobs, in one process: stage layouts, tied-parameter placement, the GPT's
bad-input checks (one line each, before any collective), the vocab-parallel loss as a value, the metrics numbers."""
from __future__ import annotations

import struct
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn

from hybrid_engine import ProcessGrid
from hybrid_engine.models import losses
from hybrid_engine.data import MAGIC, MarkovChain, TokenDataset, write_token_file
from hybrid_engine.parallel.pipeline.partition import check_layout
from hybrid_engine.parallel.pipeline.units import Half, unit_module
from hybrid_engine.config.engine import ConfigError
from hybrid_engine.models.gpt.flops import gpt_flops_per_token
from hybrid_engine.models.gpt.model import GPTConfig
from hybrid_engine.parallel.data_parallel.tied import tied_stages
from hybrid_engine.parallel.tensor.layers import parallelize_mlp
from hybrid_engine.models.gpt.workload import ParallelizeGPT, check_gpt, gpt_config_of, gpt_workload
from hybrid_engine.models.mlp.workload import mlp_workload

CFG = GPTConfig(vocab_size=256, layers=4, hidden=32, heads=4, seq_len=16, tie_embeddings=True, seed=1)


def test_check_layout_accepts_contiguous_cover_and_names_the_rule_otherwise():
    assert check_layout([[0, 1], [2], [3, 4]], 5, 3) == [[0, 1], [2], [3, 4]]
    for bad in ([[0, 1], [2, 3]], [[0, 1], [], [2, 3, 4]], [[0, 2], [1], [3, 4]], [[0], [1], [2, 3]],
                [[0, 1], [2, 3, 4]]):
        with pytest.raises(ValueError, match="non-empty, contiguous run of module indices"):
            check_layout(bad, 5, 3 if len(bad) == 3 else 4)


def test_tied_copies_must_sit_on_the_first_and_last_stage():
    model = nn.Sequential(*[nn.Linear(2, 2, device="meta") for _ in range(3)])
    model[0].weight.tied = model[2].weight.tied = "w"
    assert tied_stages(model, [[0], [1], [2]]) == {"w": [0, 2]}
    assert tied_stages(model, [[0, 1, 2]]) == {"w": [0, 0]}
    model[2].weight.tied, model[1].weight.tied = None, "w"
    with pytest.raises(ValueError, match="first and one on the last pipeline stage"):
        tied_stages(model, [[0], [1], [2]])


def test_gpt_workload_builds_a_meta_model_with_the_datas_vocabulary_and_a_balanced_layout():
    data = TokenDataset(MarkovChain(0, vocab=67).sample(2048, 0), 67, CFG.seq_len, seed=0)
    wl = gpt_workload(CFG, data, sequence_parallel=True, recompute="selective")
    assert wl.cfg.vocab_size == 67 and wl.loss == losses.VocabParallelCrossEntropy(67)
    assert all(p.is_meta for p in wl.model.parameters()) and len(wl.model) == CFG.layers + 2
    assert wl.parallelize == ParallelizeGPT(sequence_parallel=True, selective_recompute=True)
    kwargs = wl.engine_kwargs(3)  # 4 blocks and a light head over 3 stages: one block cut between its halves
    flat = [unit_module(u) for stage in kwargs["layout"] for u in stage]
    assert sorted(set(flat)) == list(range(6)) and flat == sorted(flat) and len(kwargs["layout"]) == 3
    assert [sum(isinstance(u, Half) for u in stage) for stage in kwargs["layout"]] == [1, 1, 0]
    whole = gpt_workload(CFG, data, split_blocks="off").engine_kwargs(3)["layout"]
    assert [i for s in whole for i in s] == list(range(6))
    assert wl.tokens_per_sample == 16 and wl.flops_per_token == gpt_flops_per_token(wl.cfg)
    assert not wl.full_recompute and gpt_workload(CFG, data, recompute="full").full_recompute
    assert "GPT, 4 layers" in wl.describe() and wl.describe_layout(2).count("\n") == 1
    assert wl.checkpoint_model == {"name": "gpt", "vocab_size": 67, "layers": 4, "hidden": 32, "heads": 4,
                                   "seq_len": 16, "tie_embeddings": True, "seed": 1}
    assert gpt_config_of(wl.checkpoint_model) == wl.cfg
    assert wl.param_shapes()["0.word"] == (67, 32)
    x, y = wl.draw(0, 2, 5)
    assert x.shape == y.shape == (3, 16) and x.dtype == torch.int64 and torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ConfigError, match="recompute must be one of"):
        gpt_workload(CFG, data, recompute="some")


def test_built_in_corpus_and_selective_recompute_flags():
    wl = gpt_workload(CFG, None, recompute="selective")
    assert wl.cfg.vocab_size == 256 and wl.has_validation and "markov" in wl.describe()
    stage = wl.parallelize(nn.Sequential(*list(wl.model)[:2]), None)
    assert stage[1].recompute_attention_core and not type(stage[1]).recompute_attention_core


def test_mlp_workload_is_the_course_mlp():
    wl = mlp_workload(16, 3, 0)
    assert wl.parallelize is parallelize_mlp and wl.engine_kwargs(2) == {"parallelize": parallelize_mlp,
                                                                       "layout": None}
    assert wl.loss == losses.MSE() and wl.layout(3) == [[0, 1], [2, 3], [4, 5]]
    x, y = wl.draw(1, 0, 4, dtype=torch.bfloat16)
    assert x.shape == (4, 16) and x.dtype == torch.bfloat16 and wl.flops_per_sample == 6 * 16 * 16 * 3
    assert wl.checkpoint_model == {"name": "large_linear_model", "dim": 16, "depth": 3, "seed": 0}


@pytest.mark.parametrize("shape, grid, sp, message", [
    (dict(heads=3, hidden=33), (1, 1, 2), False, "--heads 3 is not divisible by --mp 2"),
    (dict(heads=4, hidden=30), (1, 1, 1), False, "--hidden 30 is not divisible by --heads 4"),
    (dict(seq_len=15), (1, 1, 2), True, "--sequence-parallel: --seq-len 15 is not divisible by --mp 2"),
    (dict(layers=1), (1, 4, 1), False, "needs at least one per stage"),
])
def test_check_gpt_rejects_bad_shapes_in_one_line(shape, grid, sp, message):
    cfg = SimpleNamespace(**{"layers": 4, "hidden": 32, "heads": 4, "seq_len": 16, **shape})
    with pytest.raises(ConfigError, match=message) as err:
        check_gpt(cfg, ProcessGrid(*grid), sp)
    assert "\n" not in str(err.value)
    check_gpt(CFG, ProcessGrid(1, 2, 2), True)  # a good one passes


def test_check_gpt_rejects_bad_data_files(tmp_path):
    grid = ProcessGrid(1, 1, 1)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    short = tmp_path / "short.txt"
    short.write_bytes(b"abc")
    bad_id = tmp_path / "bad.tok"
    write_token_file(str(bad_id), np.arange(100) % 50, 50)
    with open(bad_id, "r+b") as f:  # rewrite the header's vocabulary to 10: ids 10..49 are now out of range
        f.write(struct.pack("<8sIIQQ", MAGIC, 1, 2, 10, 100))
    for path, message in ((tmp_path / "missing.txt", "does not exist"), (empty, "is empty"),
                          (short, "shorter than seq_len"), (bad_id, "at or above its vocabulary size 10")):
        with pytest.raises(ConfigError, match=message):
            check_gpt(CFG, grid, data_path=str(path))


def test_a_token_file_claiming_a_vocabulary_of_2_to_the_32_is_refused_before_anything_is_built(tmp_path):
    # the header allows it (4-byte tokens); the GPT on it would hold a 2^32 x hidden embedding and head: 8 TiB
    path = tmp_path / "huge.tok"
    write_token_file(str(path), np.arange(4000) % 300, 1 << 17)  # 4-byte tokens
    with open(path, "r+b") as f:
        f.write(struct.pack("<8sIIQQ", MAGIC, 1, 4, 1 << 32, 4000))
    shape = SimpleNamespace(layers=4, hidden=256, heads=4, seq_len=128, tie_embeddings=False)
    with pytest.raises(ConfigError) as err:
        check_gpt(shape, ProcessGrid(1, 1, 1), data_path=str(path))
    assert str(err.value).startswith(f"the GPT (4 layers, hidden 256, vocabulary 4294967296 of --data {path}) on "
                                     "pp x mp = 1 x 1 needs at least 8.0 TiB of fp32 weights per rank, more than "
                                     "this machine's memory ("), str(err.value)
    assert str(err.value).endswith("): smaller flags, more --pp/--mp, or (a vocabulary this large) a damaged token "
                                   "file")


def test_vocab_parallel_cross_entropy_is_a_loss_value_bound_to_the_mp_group():
    loss = losses.VocabParallelCrossEntropy(5)
    assert not losses.is_builtin(loss) and "vocab-parallel cross-entropy over 5" in losses.describe(loss)
    with pytest.raises(TypeError, match="losses.bind"):
        losses.as_micro_loss(loss)
    fn = losses.bind(loss, SimpleNamespace(mp=None))  # no group: one rank
    logits = torch.randn(2, 3, 5, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 5, (2, 3))
    value = fn(logits, targets)
    expected = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 5), targets.reshape(-1))
    assert value.dtype == torch.float32 and torch.allclose(value, expected)
    value.backward()
    assert logits.grad.dtype == torch.bfloat16  # the logits went in as they were
    with pytest.raises(ValueError):
        losses.VocabParallelCrossEntropy(0)


def _evaluate_mlp(rank: int, world: int) -> tuple[float, float]:
    import torch.nn.functional as F

    from engine_builders import make_engine
    from hybrid_engine.engine.evaluate import evaluate
    from hybrid_engine.parallel.grid import build_groups
    from hybrid_engine.models import large_linear_model, materialize

    wl = mlp_workload(16, 4, 0)
    groups = build_groups(ProcessGrid(1, 2, 1), rank)
    engine = make_engine(wl.model, groups, **wl.engine_kwargs(2))
    x, y = wl.draw(0, 0, 8)
    val = evaluate(engine, x, y, micro_batches=4)
    engine.close()
    groups.destroy()
    with torch.no_grad():
        dense = F.mse_loss(materialize(large_linear_model(16, 4, 0), "cpu")(x), y).item()
    return val, dense


def test_evaluate_runs_the_mlp_forward_only_through_the_pipeline():
    from dist_utils import run_ranks

    for val, dense in run_ranks(2, _evaluate_mlp, timeout=120):
        assert abs(val - dense) <= 1e-5 * dense
