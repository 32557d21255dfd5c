"""fp8 in the step model (planner/fp8_time.py): a --fp8 run's block GEMMs at the card's fp8 rate, twice its half
rate on Hopper; their quantization as the code does it, counted as memory traffic (each operand's maxima and casts,
the weights once a step with the cache, else every micro-batch; a tensor-parallel rank's own shapes and the maxima's
all-reduces); and the bf16 weight gradient added into the fp32 main grad in the backward, where fp8 computes it."""
from __future__ import annotations

import dataclasses
import re

import pytest

from hybrid_engine.config.checks import resolve_grid
from hybrid_engine.models import registry
from hybrid_engine.models.planner_shape import Fp8Gemms
from hybrid_engine.planner import CARDS
from hybrid_engine.planner.candidates import Plan
from hybrid_engine.planner.choose import predict
from hybrid_engine.planner.fp8_time import QUANTIZE_EFFICIENCY, both_layouts_bytes, fp8_work, one_layout_bytes
from hybrid_engine.planner.model_shape import shape_of
from hybrid_engine.planner.run_plan import plan_run
from hybrid_engine.planner.setting import Setting
from hybrid_engine.planner.step_time import stage_costs, step_time
from hybrid_engine.train.cli import parse_config

H100 = CARDS["h100"]
QUANTIZE = H100.hbm_bytes_s * QUANTIZE_EFFICIENCY  # the quantization passes' rate
H, Q, KV, F = 4096, 4096, 1024, 14336  # the 8B's block: q, kv heads x head dim, ffn
BLOCK = Fp8Gemms("tensorwise", True, ((H, Q), (H, 2 * KV), (H, F), (H, F)), ((Q, H), (F, H)))


def llama(hidden: int, *flags: str, layers: int = 2, batch: int = 2) -> list[str]:
    heads = hidden // 128
    return ["--model", "llama", "--hidden", str(hidden), "--layers", str(layers), "--heads", str(heads), "--kv-heads",
            str(max(1, heads // 4)), "--ffn-hidden", str(int(3.5 * hidden)), "--seq-len", "4096", "--vocab-size",
            "32000", "--batch-size", str(batch), "--amp", "bf16", "--plan-card", "h100", "--cuda-graphs", "off",
            "--split-blocks", "off", *flags]  # whole blocks: a layout balanced by FLOPs, not by fp8's faster GEMMs


def step_ms(flags: list[str], plan: Plan = Plan("1f1b", 2), grid=(1, 1, 1)) -> float:
    cfg = parse_config(flags)
    return step_time(shape_of(cfg), H100, Setting.of(cfg, *grid), plan).step_s * 1e3


def test_fp8_gemms_run_at_twice_the_half_rate_on_hopper_and_at_fp32_emulated():
    assert H100.fp8_flops == 2 * H100.gemm_flops and CARDS["h200"].fp8_flops == 2 * CARDS["h200"].gemm_flops
    flops, rows = 1e13, 8192
    assert H100.gemm_s(flops, rows, 0.0, True, fp8=True) == pytest.approx(H100.gemm_s(flops, rows, 0.0, True) / 2)
    cpu = CARDS["cpu"]  # no fp8 tensor cores: the emulation multiplies in fp32
    assert cpu.gemm_s(flops, rows, 0.0, True, fp8=True) == cpu.gemm_s(flops, rows, 0.0, False)


def test_a_fp8_run_is_predicted_faster_than_bf16_where_the_gemms_dominate():
    """The saving grows with the hidden size: the GEMMs grow with its square, the quantization with it."""
    saved = []
    for hidden in (1024, 2048, 4096, 8192):
        bf16, fp8 = step_ms(llama(hidden)), step_ms(llama(hidden, "--fp8"))
        saved.append(1 - fp8 / bf16)
    assert saved == sorted(saved) and saved[-1] > 0.1 and saved[0] < 0.05, saved


def test_the_quantization_grows_with_the_tokens_and_without_the_weight_cache():
    s = Setting(1, 1, 1, 2)
    one, two = fp8_work(BLOCK, H100, s, 4096, 4), fp8_work(BLOCK, H100, s, 8192, 4)
    x_bytes, dy_bytes = 4096 * BLOCK.inputs(1) * 6, 4096 * BLOCK.output_grads(1) * 6  # per 4096 more tokens
    assert two.forward_s - one.forward_s == pytest.approx(x_bytes / QUANTIZE)
    assert two.backward_s - one.backward_s == pytest.approx(dy_bytes / QUANTIZE)
    uncached = fp8_work(dataclasses.replace(BLOCK, weight_cache=False), H100, s, 4096, 4)
    # the weights' two forms every micro-batch (5 bytes a parameter each) against both once a step (6, a quarter)
    assert uncached.forward_s - one.forward_s == pytest.approx(BLOCK.params * (5 - 6 / 4) / QUANTIZE)
    assert uncached.backward_s - one.backward_s == pytest.approx(BLOCK.params * 5 / QUANTIZE)
    # the weight gradient added into the main grad: 2 + 4 + 4 bytes a parameter, in the backward, at the card's rate
    assert one.backward_s == pytest.approx(dy_bytes / QUANTIZE + 10 * BLOCK.params / H100.hbm_bytes_s)
    # a whole step of 8 micro-batches: longer without the cache
    flags = llama(4096, "--fp8", batch=8)
    assert step_ms(flags, Plan("1f1b", 8)) < step_ms(flags + ["--fp8-weight-cache", "off"], Plan("1f1b", 8))


def test_rowwise_counts_a_second_maximum_for_each_operand_read_by_two_gemms():
    assert (both_layouts_bytes("tensorwise", 2), both_layouts_bytes("rowwise", 2), one_layout_bytes(2)) == (6, 8, 5)
    s, tokens, m = Setting(1, 1, 1, 2), 4096, 4
    rowwise = dataclasses.replace(BLOCK, recipe="rowwise")
    tensor, row = fp8_work(BLOCK, H100, s, tokens, m), fp8_work(rowwise, H100, s, tokens, m)
    assert row.forward_s - tensor.forward_s == pytest.approx(
        (tokens * BLOCK.inputs(1) * 2 + BLOCK.params * 2 / m) / QUANTIZE)
    assert row.backward_s - tensor.backward_s == pytest.approx(tokens * BLOCK.output_grads(1) * 2 / QUANTIZE)
    # without the cache each weight form is one GEMM's, one maximum either way
    off = dict(weight_cache=False)
    assert fp8_work(dataclasses.replace(rowwise, **off), H100, s, tokens, m).forward_s - \
        fp8_work(dataclasses.replace(BLOCK, **off), H100, s, tokens, m).forward_s == \
        pytest.approx(tokens * BLOCK.inputs(1) * 2 / QUANTIZE)
    assert step_ms(llama(4096, "--fp8", "--fp8-recipe", "rowwise")) > step_ms(llama(4096, "--fp8"))


def test_a_tensor_parallel_rank_quantizes_its_own_shapes_and_all_reduces_the_split_maxima():
    # column-parallel (q, kv, gate, up): x whole, dy split; row-parallel (out, down): x split, dy whole
    assert BLOCK.inputs(2) == 4 * H + (Q + F) / 2 and BLOCK.output_grads(2) == (Q + 2 * KV + 2 * F) / 2 + 2 * H
    assert BLOCK.inputs(1) == 4 * H + Q + F
    s1, s2, m = Setting(1, 1, 1, 2), Setting(1, 1, 2, 2), 4
    one, two = fp8_work(BLOCK, H100, s1, 4096, m), fp8_work(BLOCK, H100, s2, 4096, m)
    assert (one.forward_reductions, one.backward_reductions) == (0, 0)
    assert (two.forward_reductions, two.backward_reductions) == (2 + 6 / m, 4)  # x of out, down; dy of the four
    assert two.forward_s == pytest.approx((4096 * BLOCK.inputs(2) * 6 + BLOCK.params / 2 * 6 / m) / QUANTIZE)
    off = fp8_work(dataclasses.replace(BLOCK, weight_cache=False), H100, s2, 4096, m)
    assert (off.forward_reductions, off.backward_reductions) == (2 + 6, 4 + 6)  # tensor-wise: every weight's maximum
    row_off = fp8_work(dataclasses.replace(BLOCK, weight_cache=False, recipe="rowwise"), H100, s2, 4096, m)
    assert (row_off.forward_reductions, row_off.backward_reductions) == (2 + 2, 4 + 4)  # along a split dimension


def test_the_fp8_weight_gradient_runs_in_the_backward_not_in_a_deferred_w():
    """fp8 layers compute their weight gradient in B (fp8/linear.py), so a zero-bubble schedule's W of a stage of fp8
    blocks keeps almost nothing, and its I holds the GEMM."""
    plan = Plan("zb1", 8)
    costs = {}
    for name, extra in (("bf16", ()), ("fp8", ("--fp8",))):
        cfg = parse_config(llama(4096, *extra, layers=8, batch=8))
        costs[name] = stage_costs(shape_of(cfg), H100, Setting.of(cfg, 1, 4, 1), plan)[0][1]  # a middle stage
    bf16, fp8 = costs["bf16"], costs["fp8"]
    assert fp8.W < 0.05 * bf16.W and fp8.I > bf16.I and fp8.B < bf16.B


def test_the_plan_command_and_the_drivers_plan_line_time_a_fp8_run(capsys):
    from hybrid_engine import plan

    def first_row_ms(flags: list[str]) -> float:
        assert plan.main(["--world-size", "2"] + flags) == 0
        rows = [line for line in capsys.readouterr().out.splitlines() if line[:4].strip().isdigit()]
        return float(re.search(r"\s([\d.e+]+)\s+[\d.e+]+\s+[\d.]+(\s|$)", rows[0]).group(1))

    bf16, fp8 = first_row_ms(llama(4096, batch=8)), first_row_ms(llama(4096, "--fp8", batch=8))
    assert fp8 < 0.9 * bf16, (bf16, fp8)
    lines = {}
    for name, flags in (("bf16", llama(4096, batch=8)), ("fp8", llama(4096, "--fp8", batch=8))):
        cfg = parse_config(flags + ["--pp", "2"])
        _, choice = plan_run(cfg, resolve_grid(None, 2, 1, cfg.parallel.order, 2), "cpu", registry.check_model)
        predicted = predict(shape_of(cfg), H100, Setting.of(cfg, 1, 2, 1), choice.chosen.plan).step_s
        assert f"predicted {predicted * 1e3:.3g} ms/step" in choice.line()
        lines[name] = predicted
    assert lines["fp8"] < 0.9 * lines["bf16"], lines


def test_each_row_of_the_plan_command_is_timed_with_the_kernels_its_run_gets():
    """The fused kernels and fp8's weight cache depend on the grid's mp and ZeRO level (auto: no cache under ZeRO-3,
    the elementwise modules unfused under tensor parallelism): each row is its own run's prediction."""
    from hybrid_engine.planner.grids import rank_grids

    cfg = parse_config(llama(4096, "--fp8", batch=8))
    seen = set()
    for (dp, pp, mp), cp, zero, p, *_ in rank_grids(cfg, 4, H100, "cpu", registry.check_model):
        if p is None:
            continue
        c = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, dp=dp, pp=pp, mp=mp, cp=cp),
                                data_parallel=dataclasses.replace(cfg.data_parallel, zero=zero))
        shape = shape_of(c)
        assert p.step_s == predict(shape, H100, Setting.of(c, dp, pp, mp), p.plan).step_s, (dp, pp, mp, cp, zero)
        seen.add((zero == 3, shape.layers[1].fp8.weight_cache))
    assert seen == {(False, True), (True, False)}
