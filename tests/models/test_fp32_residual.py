"""`--fp32-residual` (models/gpt.py: Embedding.fp32_residual, layer_norm): under half weights the residual stream
stays fp32, so the blocks' small updates are not rounded to half precision as they are added. In one process, on
the dense and the tensor-parallel layers (mp_group None); the engine's runs are in test_gpt_engine.py
(GRIDS_HALF) and the flag's checks in test_run_config.py."""
from __future__ import annotations

import copy

import torch

from hybrid_engine.models.gpt.model import GPTConfig
from hybrid_engine.models.gpt.parallelize import build_gpt
from hybrid_engine.models.gpt.workload import ParallelizeGPT

CFG = GPTConfig(vocab_size=256, layers=12, hidden=64, heads=4, seq_len=32, seed=1)


def _tokens() -> torch.Tensor:
    return torch.randint(0, CFG.vocab_size, (4, CFG.seq_len), generator=torch.Generator().manual_seed(5))


def _rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).norm() / want.norm()).item()


@torch.no_grad()
def test_with_fp32_weights_the_switch_changes_nothing():
    torch.set_num_threads(1)
    model, tokens = build_gpt(CFG), _tokens()
    want = model(tokens)
    model[0].fp32_residual = True
    assert torch.equal(model(tokens), want)


@torch.no_grad()
def test_half_weights_keep_an_fp32_stream_and_track_the_fp32_model_closer():
    torch.set_num_threads(1)
    reference, tokens = build_gpt(CFG), _tokens()
    want = reference(tokens)
    half = copy.deepcopy(reference).to(torch.bfloat16)
    plain = half(tokens)
    half[0].fp32_residual = True
    widened = half(tokens)
    # The stream between layers (what a pipeline stage sends) is fp32; the logits come from the half LM head.
    assert half[:1](tokens).dtype == torch.float32 and half[:7](tokens).dtype == torch.float32
    assert widened.dtype == torch.bfloat16
    # 12 blocks whose updates are ~1% of the stream: rounding each sum to bf16 costs more than the half GEMMs.
    # Measured: 0.94% relative error in the logits against 0.43% with the fp32 stream.
    assert _rel_error(widened, want) < 0.6 * _rel_error(plain, want)


@torch.no_grad()
def test_the_tensor_parallel_layers_take_the_switch_from_the_workload():
    torch.set_num_threads(1)
    dense, tokens = build_gpt(CFG).to(torch.bfloat16), _tokens()
    dense[0].fp32_residual = True
    want = dense(tokens)
    stage = ParallelizeGPT(fp32_residual=True)(build_gpt(CFG).to(torch.bfloat16), None)
    assert stage[0].fp32_residual and stage[:3](tokens).dtype == torch.float32
    assert torch.equal(stage(tokens), want)
    assert not ParallelizeGPT()(build_gpt(CFG), None)[0].fp32_residual


def test_the_run_summary_names_the_fp32_stream():
    from hybrid_engine.models.gpt.workload import gpt_workload

    assert "residual stream fp32" in gpt_workload(CFG, fp32_residual=True).summary
    assert "residual stream" not in gpt_workload(CFG).summary
