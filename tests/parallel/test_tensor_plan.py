"""Parallelism applied from outside the model (parallel/tensor/plan.py): the GPT and the Llama are plain modules that
import nothing of ranks; their plans make them tensor- and sequence-parallel, leaving the dense model as it was.
One process: the Llama through the parallel layers equals the plain Llama bit for bit with the same names and
tags, a meta build materialized keeps every tag, a bad plan is one line. Gloo ranks: the Llama split over mp 2
(kv heads split) and 4 (kv heads replicated), with and without sequence parallelism, gives the dense loss and
gradients to 1e-5, and a meta build parallelized and materialized holds exactly its slices of the dense weights."""
from __future__ import annotations

import ast
import pathlib

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks

import hybrid_engine
from hybrid_engine.models import materialize
from hybrid_engine.models.decoder import next_token_loss
from hybrid_engine.models.llama.config import LlamaConfig
from hybrid_engine.models.llama.model import dense_llama
from hybrid_engine.models.llama.parallelize import build_llama, parallelize_llama
from hybrid_engine.parallel.tensor.layers import copy_placement, gather_full, is_mp_split, take_shard
from hybrid_engine.parallel.tensor.plan import Column, parallelize_module
from hybrid_engine.parallel.tensor.vocab_cross_entropy import vocab_parallel_cross_entropy

pytestmark = pytest.mark.usefixtures("one_thread")
PACKAGE = pathlib.Path(hybrid_engine.__file__).parent


def config(kv_heads: int = 2, tied: bool = True, qkv_bias: bool = True) -> LlamaConfig:
    return LlamaConfig(67, 2, 32, 4, kv_heads, 48, 16, tie_embeddings=tied, rope_theta=500.0, qkv_bias=qkv_bias,
                       seed=3)


def _data(seed: int) -> torch.Tensor:
    return torch.randint(0, 67, (2, 16), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_the_models_import_nothing_of_ranks(model):
    tree = ast.parse((PACKAGE / "models" / model / "model.py").read_text())
    imported = [node.module if isinstance(node, ast.ImportFrom) else alias.name
                for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names]
    assert imported and not [m for m in imported if m and ("_C" in m.split(".") or ".parallel" in f".{m}")], imported
    assert "_C" not in {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                        for alias in node.names}


def test_one_process_llama_equals_the_plain_llama_bit_for_bit_and_leaves_it_alone():
    cfg = config()
    dense = dense_llama(cfg)
    before = {name: p.detach().clone() for name, p in dense.named_parameters()}
    par = parallelize_llama(dense, None)
    assert [n for n, _ in par.named_parameters()] == [n for n, _ in dense.named_parameters()]
    ptrs = {p.data_ptr() for p in dense.parameters()}
    assert not any(p.data_ptr() in ptrs for p in par.parameters()), "the result shares no tensor with the model"
    tokens = _data(1)
    assert torch.equal(par(tokens), dense(tokens))
    next_token_loss(par(tokens), _data(2)).backward()
    assert all(p.grad is None for p in dense.parameters())
    assert all(torch.equal(p, before[n]) for n, p in dense.named_parameters())
    # the plan tags; the plain model carries no placement of its own
    assert not any(hasattr(p, "mp_split") or hasattr(p, "tied") for p in dense.parameters())
    assert par[0].word.tied == par[-1].lm_head.weight.tied == "word_embeddings"
    assert par[0].word.no_weight_decay and par[-1].lm_head.weight.no_weight_decay
    assert not any(is_mp_split(p) for p in par.parameters())


def test_a_meta_build_materialized_keeps_its_tags_and_equals_a_direct_build():
    cfg = config()
    meta = build_llama(cfg, "meta")
    built = materialize(meta, "cpu")
    for (name, p), q in zip(built.named_parameters(), build_llama(cfg).parameters()):
        assert torch.equal(p, q), name
        assert {k: v for k, v in vars(p).items()} == {k: v for k, v in vars(q).items()}, name
    assert built[0].word.tied == "word_embeddings" and built[1].norm_attn.weight.mp_split is False
    assert torch.equal(built[1].rope_cos, build_llama(cfg)[1].rope_cos)


def test_a_plan_that_misses_or_a_layer_already_split_is_one_line():
    block = dense_llama(config(), "meta")[1]
    with pytest.raises(ValueError, match=r"^parallelize: no module of Block matches 'attn_qkv'$"):
        parallelize_module(block, {"attn_qkv": Column()}, None)
    block.attn_q.weight.mp_split = True
    with pytest.raises(ValueError, match=r"^parallelize: Block is already split over MP \(attn_q.weight\)$"):
        parallelize_module(block, {"attn_q": Column()}, None)


def _split_llama_matches_dense(rank: int, world: int) -> dict:
    group = dist.new_group(list(range(world)))
    kv_heads = 2  # split whole over mp 2, replicated over mp 4
    for sp in (False, True):
        cfg = config(kv_heads)
        dense = dense_llama(cfg)
        par = parallelize_llama(dense, group, sp)
        tokens, targets = _data(1), _data(2)
        ref = next_token_loss(dense(tokens), targets)
        ref.backward()
        loss = vocab_parallel_cross_entropy(par(tokens), targets, group, cfg.vocab_size)
        loss.backward()
        assert abs(loss.item() - ref.item()) <= 1e-5 * ref.item(), (sp, loss.item(), ref.item())
        for (name, p), (_, q) in zip(par.named_parameters(), dense.named_parameters()):
            grad = gather_full(copy_placement(p, p.grad.detach().clone()), group)
            assert grad.shape == q.shape, name
            assert ((grad - q.grad).abs().max() / q.grad.abs().max()).item() < 1e-5, (sp, name)
        assert is_mp_split(par[1].attn_kv.weight) == (world == 2)
        # each half of a block enters the MP region once, after its norm; the projections that read it are local
        block = par[1]
        assert block.norm_attn.enter_region and block.norm_mlp.enter_region
        assert block.norm_attn.sequence_parallel == sp and not getattr(par[-1].norm, "enter_region", False)
        assert all(getattr(block, n).input_in_region for n in ("attn_q", "mlp_gate", "mlp_up"))
        assert world == 4 or block.attn_kv.input_in_region
    # on meta, parallelized, then materialized: exactly this rank's slices of the dense initialisation
    dense = build_llama(config(kv_heads))
    built = materialize(parallelize_llama(build_llama(config(kv_heads), "meta"), group, True), "cpu")
    for (name, p), q in zip(built.named_parameters(), dense.parameters()):
        assert torch.equal(p, take_shard(q, p, group)), name
        assert torch.equal(gather_full(p, group), q), name
    return {"ok": True}


@pytest.mark.parametrize("mp", [2, 4])
def test_the_llama_split_over_mp_gives_the_dense_loss_and_gradients(mp):
    assert all(r["ok"] for r in run_ranks(mp, _split_llama_matches_dense, timeout=180))
