"""FLOPs per token (6 N + 12 L h s) and MFU against datasheet peaks (flops.py)."""
from __future__ import annotations

import pytest
import torch

from hybrid_engine.metrics.flops import mfu, peak_flops
from hybrid_engine.models.gpt.flops import gpt_flops_per_token, gpt_matmul_params, gpt_param_count
from hybrid_engine.models.gpt.model import GPTConfig
from hybrid_engine.models.gpt.parallelize import build_gpt

ANCHOR = GPTConfig(vocab_size=32000, layers=16, hidden=2048, heads=16, seq_len=2048)  # ../shared/anchors


@pytest.mark.parametrize("tied", [False, True])
def test_param_count_equals_the_built_model(tied):
    cfg = GPTConfig(vocab_size=37, layers=3, hidden=16, heads=4, seq_len=8, tie_embeddings=tied)
    model = build_gpt(cfg, device="meta")
    total = sum(p.numel() for p in model.parameters())
    if tied:  # two Parameters on (possibly) two stages, one weight
        total -= model[-1].lm_head.weight.numel()
    assert gpt_param_count(cfg) == total
    embeddings = model[0].word.numel() + model[0].position.numel()
    assert gpt_matmul_params(cfg) == sum(p.numel() for p in model.parameters()) - embeddings


def test_anchor_model_flops_and_mfu_match_the_measured_anchors():
    # gpt_peers.py's model (941.0M) has QKV biases; ours has none (see models/gpt.py): 16 x 3 x 2048 fewer.
    assert gpt_param_count(ANCHOR) + 16 * 3 * 2048 == 941_002_752
    assert gpt_flops_per_token(ANCHOR) == 6 * gpt_matmul_params(ANCHOR) + 12 * 16 * 2048 * 2048
    # The anchors count every parameter: torch.compile's 80,858 tokens/s was 52.7 % of 989 TFLOP/s.
    assert round(mfu(80858, gpt_flops_per_token(ANCHOR, all_params=True), "NVIDIA H200", "bf16"), 3) == 0.527
    assert gpt_flops_per_token(ANCHOR) < gpt_flops_per_token(ANCHOR, all_params=True)


def test_peaks_from_the_datasheet_and_none_for_unknown_cards():
    assert peak_flops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989e12
    assert peak_flops("NVIDIA H200", "fp16") == 989e12
    assert peak_flops("NVIDIA H100 80GB HBM3", torch.float32) == 67e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16") is None
    assert mfu(1e5, 6e9, "NVIDIA GeForce RTX 4090", "bf16") is None
    assert mfu(1e5, 6e9, "", "bf16") is None
    assert mfu(1e5, 6e9, "NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(6e14 / 989e12)
