"""Tensor-parallel GPT (models/gpt/parallelize.py) on gloo ranks against the dense model (models/gpt/model.py), fp32,
relative 1e-5.

mp = 2 and 4 over a vocabulary of 37 (padded to 38 / 40): the embedding, each block and the head + vocab-parallel
loss reproduce the dense outputs, input gradients and parameter gradients (gathered with `gather_full`, which
drops the vocabulary padding), with and without sequence parallelism, tied and untied. Layers parallelized from a
built model, or from meta and materialized, hold exactly their slice of the dense initialisation. One process: the
loss equals F.cross_entropy, padding columns never count, and the mp = 1 layers equal the plain ones bit for bit.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from dist_utils import run_ranks

from hybrid_engine import _C
from hybrid_engine.models import materialize
from hybrid_engine.models.gpt.model import GPTConfig, dense_gpt, gpt_loss
from hybrid_engine.parallel.tensor.layers import (ColumnParallelLinear, RowParallelLinear, copy_placement, gather_full,
                                                  is_mp_split, take_shard)
from hybrid_engine.parallel.tensor.vocab_parallel import VocabParallelLookup
from hybrid_engine.models.gpt.parallelize import (
    boundary_shape,
    build_gpt,
    check_gpt_parallel,
    padded_vocab_size,
    parallelize_gpt,
    scatter_along_sequence,
    vocab_parallel_cross_entropy,
)

CFG = dict(vocab_size=37, layers=2, hidden=16, heads=4, seq_len=8, seed=5)
BATCH = 2
TOL = 1e-5


pytestmark = pytest.mark.usefixtures("one_thread")


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _data(cfg: GPTConfig, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d = torch.randint(0, cfg.vocab_size, (BATCH, cfg.seq_len + 1), generator=g)
    return d[:, :-1], d[:, 1:]


def _perturb(model, seed: int = 7) -> None:
    """Non-zero biases and non-identity LayerNorms, so their sharding and gradients are exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def _grad_full(param, group) -> torch.Tensor:
    return gather_full(copy_placement(param, param.grad.detach().clone()), group)


# ------------------------------------------------------------------------------------------------ one process


@pytest.mark.parametrize("vocab,pad", [(11, 0), (11, 3)])
def test_loss_equals_cross_entropy_and_ignores_padding_columns(vocab, pad):
    g = torch.Generator().manual_seed(1)
    logits = (3 * torch.randn(4, 5, vocab + pad, generator=g)).requires_grad_(True)
    with torch.no_grad():
        logits[..., vocab:] = 50.0  # padding that would dominate if it counted
    targets = torch.randint(0, vocab, (4, 5), generator=g)
    loss = vocab_parallel_cross_entropy(logits, targets, None, vocab)
    ref_logits = logits.detach()[..., :vocab].clone().requires_grad_(True)
    ref = F.cross_entropy(ref_logits.reshape(-1, vocab), targets.reshape(-1))
    assert loss.dtype == torch.float32 and abs(loss.item() - ref.item()) <= 1e-6 * ref.item()
    (2 * loss).backward()
    (2 * ref).backward()
    assert _rel_err(logits.grad[..., :vocab], ref_logits.grad) < 1e-6
    assert torch.all(logits.grad[..., vocab:] == 0)
    assert torch.all(logits[..., vocab:] == 50.0), "the loss must not write into the logits"


def test_loss_of_half_logits_computes_in_fp32_and_returns_half_gradients():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 13, generator=g).to(torch.bfloat16).requires_grad_(True)
    targets = torch.randint(0, 13, (6,), generator=g)
    loss = vocab_parallel_cross_entropy(logits, targets, None, 13)
    ref = F.cross_entropy(logits.detach().float(), targets)
    assert loss.dtype == torch.float32 and abs(loss.item() - ref.item()) < 1e-6
    loss.backward()
    assert logits.grad.dtype == torch.bfloat16


def test_single_rank_layers_equal_the_plain_layers_bit_for_bit():
    cfg = GPTConfig(**CFG)
    dense = dense_gpt(cfg)
    _perturb(dense)
    par = parallelize_gpt(dense, None)
    assert [type(m) for m in par] == [type(m) for m in dense]
    assert isinstance(par[0].lookup, VocabParallelLookup) and isinstance(par[-1].lm_head, ColumnParallelLinear)
    assert [type(getattr(par[1], n)) for n in ("attn_qkv", "attn_proj", "mlp_fc1", "mlp_fc2")] == [
        ColumnParallelLinear, RowParallelLinear, ColumnParallelLinear, RowParallelLinear]
    assert type(dense[1].attn_qkv) is not ColumnParallelLinear, "the dense model is left as it was"
    assert [n for n, _ in par.named_parameters()] == [n for n, _ in dense.named_parameters()]
    assert not any(is_mp_split(p) for p in par.parameters())
    tokens, targets = _data(cfg)
    assert torch.equal(par(tokens), dense(tokens))
    loss = vocab_parallel_cross_entropy(par(tokens), targets, None, cfg.vocab_size)
    ref = gpt_loss(dense(tokens), targets)
    assert abs(loss.item() - ref.item()) <= 1e-6 * ref.item()
    # Parallelized on meta and materialized, the layers draw the same initial weights.
    fresh = parallelize_gpt(dense_gpt(cfg, device="meta"), None)
    for (name, p), q in zip(materialize(fresh, "cpu").named_parameters(), dense_gpt(cfg).parameters()):
        assert torch.equal(p, q), name


def test_grid_checks_and_boundary_shapes():
    cfg = GPTConfig(**CFG)  # 4 heads, seq 8
    check_gpt_parallel(cfg, 4, sequence_parallel=True)
    with pytest.raises(ValueError, match="heads 4 is not divisible by the model-parallel size 3"):
        check_gpt_parallel(cfg, 3)
    with pytest.raises(ValueError, match="seq-len 6 is not divisible by the model-parallel size 4"):
        check_gpt_parallel(GPTConfig(**{**CFG, "seq_len": 6}), 4, sequence_parallel=True)
    check_gpt_parallel(GPTConfig(**{**CFG, "seq_len": 6}), 4)
    assert boundary_shape(cfg, 3, 2) == (3, 8, 16)
    assert boundary_shape(cfg, 3, 2, sequence_parallel=True) == (3, 4, 16)


def test_padded_vocab_size():
    assert [padded_vocab_size(37, p) for p in (1, 2, 4, 8)] == [37, 38, 40, 40]
    assert padded_vocab_size(3, 4) == 4


# ------------------------------------------------------------------------------------------------ gloo ranks


def _check_model(group, rank: int, size: int, cfg: GPTConfig, sp: bool) -> None:
    dense = build_gpt(cfg)
    _perturb(dense)
    par = parallelize_gpt(dense, group, sequence_parallel=sp)
    tokens, targets = _data(cfg)

    # Layer by layer, keeping the gradient at every boundary: what a pipeline stage receives and sends.
    def run(model):
        x, outs = tokens, []
        for layer in model:
            x = layer(x)
            x.retain_grad()
            outs.append(x)
        return outs

    d_out = run(dense)
    d_loss = gpt_loss(d_out[-1], targets)
    d_loss.backward()
    outs = run(par)
    loss = vocab_parallel_cross_entropy(outs[-1], targets, group, cfg.vocab_size)
    loss.backward()

    assert abs(loss.item() - d_loss.item()) <= TOL * d_loss.item(), (loss.item(), d_loss.item())
    # Hidden states between layers: full [b, s, h], or this rank's sequence chunk under SP.
    chunk = (lambda t: t.chunk(size, dim=1)[rank]) if sp else (lambda t: t)
    for i in range(len(dense) - 1):
        assert outs[i].shape == chunk(d_out[i]).shape
        assert _rel_err(outs[i], chunk(d_out[i])) < TOL, f"layer {i} output"
        assert _rel_err(outs[i].grad, chunk(d_out[i].grad)) < TOL, f"gradient out of layer {i}"
    # Logits: this rank's vocabulary slice, all positions; the padding columns of the last rank are the zero rows.
    part = padded_vocab_size(cfg.vocab_size, size) // size
    full = torch.cat([d_out[-1], torch.zeros(*d_out[-1].shape[:-1], part * size - cfg.vocab_size)], dim=-1)
    assert _rel_err(outs[-1], full[..., rank * part:(rank + 1) * part]) < TOL, "logits"
    # Every parameter's gradient, gathered back to the dense shape (vocabulary padding dropped).
    for (name, p), (_, q) in zip(par.named_parameters(), dense.named_parameters()):
        assert is_mp_split(p) == (size > 1 and (name.endswith(("word", "lm_head.weight", "qkv.weight",
                                                                "fc1.weight", "fc1.bias", "proj.weight",
                                                                "fc2.weight")))), name
        g = _grad_full(p, group)
        assert g.shape == q.shape, name
        assert _rel_err(g, q.grad) < TOL, name


def _sum_tied_grads(model) -> None:
    """What the engine does for tied embeddings (Megatron's embedding all-reduce between the first and the last
    stage): both copies get the sum of their gradients. Under TP the two shards hold the same vocabulary rows."""
    tied = [p for p in model.parameters() if getattr(p, "tied", None)]
    if tied:
        total = sum(p.grad for p in tied)
        for p in tied:
            p.grad = total.clone()


def _train(model, loss_fn, steps: int) -> list[float]:
    # SGD, not Adam: Adam scales every element's step to ~lr whatever its gradient's size, so the rounding
    # differences of near-zero gradient elements (different GEMM splits) become lr-sized weight differences;
    # SGD keeps weight differences at lr x gradient differences, which is what this test bounds.
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, weight_decay=0.01)
    losses = []
    for step in range(steps):
        tokens, targets = _data(GPTConfig(**CFG), seed=100 + step % 2)  # two batches, seen twice
        opt.zero_grad()
        loss = loss_fn(model(tokens), targets)
        loss.backward()
        _sum_tied_grads(model)
        opt.step()
        losses.append(loss.item())
    return losses


def _tp_training_matches_dense(group, rank: int, size: int) -> None:
    """A few SGD steps (momentum, weight decay): the TP + SP model's loss curve and final weights equal the dense
    model's, tied and untied; the vocabulary padding rows stay zero."""
    for tied in (False, True):
        cfg = GPTConfig(**{**CFG, "tie_embeddings": tied})
        dense = build_gpt(cfg)
        par = parallelize_gpt(dense, group, sequence_parallel=True)
        ref = _train(dense, gpt_loss, 4)
        got = _train(par, lambda logits, t: vocab_parallel_cross_entropy(logits, t, group, cfg.vocab_size), 4)
        assert all(abs(a - b) <= TOL * abs(b) for a, b in zip(got, ref)), (tied, got, ref)
        assert ref[-1] < ref[0]
        for (name, p), q in zip(par.named_parameters(), dense.parameters()):
            assert _rel_err(gather_full(p, group), q.detach()) < TOL, (tied, name)
        if tied:
            assert torch.equal(par[0].word, par[-1].lm_head.weight)
        pad_from = cfg.vocab_size - rank * par[-1].lm_head.weight.shape[0]  # this rank's first row's id
        if pad_from < par[-1].lm_head.weight.shape[0]:
            assert torch.all(par[-1].lm_head.weight[pad_from:] == 0) and torch.all(par[0].word[pad_from:] == 0)


def _tp_gpt_matches_dense(rank: int, world_size: int, mp: int) -> dict:
    group = dist.new_group(list(range(mp)))
    others = [dist.new_group([r]) for r in range(world_size)]  # noqa: F841 - every rank creates every group
    if rank >= mp:
        return {}
    for sp in (False, True):
        for tied in (False, True):
            _check_model(group, rank, mp, GPTConfig(**{**CFG, "tie_embeddings": tied}), sp)
    _tp_training_matches_dense(group, rank, mp)

    cfg = GPTConfig(**CFG)
    dense = build_gpt(cfg)
    # Parallelized from a built model, or on meta and materialized: exactly this rank's slice of the dense
    # initialisation.
    built = parallelize_gpt(build_gpt(cfg, device="meta"), group)
    built = materialize(built, "cpu")
    direct = list(build_gpt(cfg, mp_group=group))
    for layers in (list(built), direct):
        for layer in layers:
            ref = dense[layer.index]
            for (name, p), q in zip(layer.named_parameters(), ref.parameters()):
                assert torch.equal(gather_full(p, group), q), f"{type(layer).__name__}.{name}"
                assert torch.equal(take_shard(q, p, group), p), f"{type(layer).__name__}.{name}"
    # A checkpoint gathered from the shards loads, by name and shape, into the dense model of one process.
    state = {name: gather_full(p, group) for name, p in built.state_dict(keep_vars=True).items()}
    fresh = build_gpt(GPTConfig(**{**CFG, "seed": 99}))
    fresh.load_state_dict(state, strict=True)
    for p, q in zip(fresh.parameters(), dense.parameters()):
        assert torch.equal(p, q)
    head = built[-1]
    if rank == mp - 1 and padded_vocab_size(cfg.vocab_size, mp) > cfg.vocab_size:
        vocab_start = rank * head.lm_head.weight.shape[0]
        assert torch.all(head.lm_head.weight[cfg.vocab_size - vocab_start:] == 0), "padding rows are zero"
        assert torch.all(built[0].word[cfg.vocab_size - vocab_start:] == 0)
    # The vocab-parallel loss alone, on random logits with a vocabulary not divisible by mp.
    for vocab in (37, 40, 3):
        part = padded_vocab_size(vocab, mp) // mp
        g = torch.Generator().manual_seed(vocab)
        full = 4 * torch.randn(3, 5, vocab, generator=g)
        targets = torch.randint(0, vocab, (3, 5), generator=g)
        padded = torch.cat([full, torch.full((3, 5, part * mp - vocab), 30.0)], dim=-1)
        mine = padded[..., rank * part:(rank + 1) * part].clone().requires_grad_(True)
        loss = vocab_parallel_cross_entropy(mine, targets, group, vocab)
        ref_logits = full.clone().requires_grad_(True)
        ref = F.cross_entropy(ref_logits.reshape(-1, vocab), targets.reshape(-1))
        assert abs(loss.item() - ref.item()) <= 1e-6 * ref.item(), (vocab, loss.item(), ref.item())
        loss.backward()
        ref.backward()
        ref_grad = torch.cat([ref_logits.grad, torch.zeros(3, 5, part * mp - vocab)], dim=-1)
        assert _rel_err(mine.grad, ref_grad[..., rank * part:(rank + 1) * part]) < 1e-6
    # Sequence-parallel entry helper: a replicated tensor split into chunks, gradients gathered back.
    x = torch.arange(2.0 * 8).view(1, 8, 2).requires_grad_(True)
    y = scatter_along_sequence(x, group)
    assert torch.equal(y, x.chunk(mp, dim=1)[rank])
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    return {"ok": True}


def _construction_errors(rank: int, world_size: int) -> None:
    group = dist.new_group(list(range(world_size)))
    with pytest.raises(ValueError, match="heads 2 is not divisible by the model-parallel size 4"):
        build_gpt(GPTConfig(vocab_size=8, layers=1, hidden=8, heads=2, seq_len=8), mp_group=group)
    emb = build_gpt(GPTConfig(vocab_size=8, layers=1, hidden=8, heads=4, seq_len=6), mp_group=group,
                    sequence_parallel=True)[0]
    with pytest.raises(ValueError, match="sequence length 6 is not divisible by the model-parallel size 4"):
        emb(torch.zeros(1, 6, dtype=torch.long))
    assert _C.group_rank_and_size(group)[1] == world_size


@pytest.mark.parametrize("mp", [2, 4])
def test_tensor_parallel_gpt_matches_the_dense_model(mp):
    results = run_ranks(mp, _tp_gpt_matches_dense, mp, timeout=120)
    assert all(r.get("ok") for r in results[:mp])


def test_tensor_parallel_layers_reject_bad_shapes():
    run_ranks(4, _construction_errors, timeout=60)


@pytest.mark.parametrize("b,p", [(1, 2), (2, 2), (3, 4)])
def test_sequence_slabs_are_the_chunks_the_flat_collectives_exchange(b, p):
    # On NCCL the sequence-parallel gather and reduce-scatter use the flat collectives, which read and write rank
    # r's piece as the r-th slab along dim 0; these layouts must be exactly the sequence chunks (CPU runs gloo's
    # list form, so this is what checks the GPU path's indexing).
    from hybrid_engine.parallel.tensor.sequence_parallel import sequence_from_slabs, sequence_to_slabs
    x = torch.randn(b, 4 * p, 3, 5)
    slabs = sequence_to_slabs(x, p)
    assert slabs.is_contiguous() and slabs.shape == (p, b, 4, 3, 5)
    for r, chunk in enumerate(x.chunk(p, dim=1)):
        assert torch.equal(slabs[r], chunk)
    assert torch.equal(sequence_from_slabs(slabs), x)
