"""The planner sees a context-parallel rank's share of each sequence: a Llama-1B-class model at 128k tokens fits an
H100 on cp 4 (about 56 GiB predicted) where one rank would need far more; and a sequence that long is a size the
flags take."""
from __future__ import annotations

import pytest

from hybrid_engine.config.engine import ConfigError
from hybrid_engine.models import registry
from hybrid_engine.planner import plan_run
from hybrid_engine.planner.context import per_context_rank
from hybrid_engine.planner.model_shape import shape_of
from hybrid_engine.train.cli import parse_config

# Unfused modules: these tests weigh cp against the grids at what an unfused Llama keeps (with the fused kernels an
# H100 gets by default, tp4 holds 128k tokens too and is predicted faster).
SHAPE = ["--model", "llama", "--layers", "16", "--hidden", "2048", "--heads", "32", "--kv-heads", "8",
         "--ffn-hidden", "5632", "--max-positions", "131072", "--batch-size", "1", "--micro-batches", "1",
         "--schedule", "1f1b", "--amp", "bf16", "--plan-card", "h100", "--fused-kernels", "off"]


def _plan(seq: int, cp: int):
    cfg = parse_config(SHAPE + ["--seq-len", str(seq), "--cp", str(cp)])
    grid = cfg.validate(cp, "cpu", registry.check_model)
    return cfg, plan_run(cfg, grid, "cpu", registry.check_model)[1]


def test_a_cp_rank_keeps_its_share_of_each_sequence():
    whole = shape_of(parse_config(SHAPE + ["--seq-len", "131072"]))
    mine = per_context_rank(whole, 4)
    assert mine.tokens_per_sample == whole.tokens_per_sample // 4 == 32768
    assert mine.flops_per_sample == whole.flops_per_sample / 4 and mine.data_bytes == whole.data_bytes / 4
    assert mine.layers == whole.layers  # a token's attention still spans the whole sequence
    assert per_context_rank(whole, 1) is whole


def test_128k_tokens_fit_four_h100s_on_cp4_and_not_one():
    cfg, choice = _plan(131072, 4)
    assert shape_of(cfg).tokens_per_sample == 32768
    assert 40 * 2**30 < choice.chosen.peak < 70 * 2**30
    with pytest.raises(ConfigError, match="no plan fits"):
        _plan(131072, 1)


def test_a_sequence_that_fits_no_plan_hears_which_cp_would_fit():
    cfg = parse_config(SHAPE + ["--seq-len", "131072", "--batch-size", "4", "--micro-batches", "auto"])
    grid = cfg.validate(4, "cpu", registry.check_model)
    with pytest.raises(ConfigError) as refused:
        plan_run(cfg, grid, "cpu", registry.check_model)
    assert str(refused.value).startswith("planner: no plan fits")
    assert str(refused.value).endswith("; --cp 4 fits: each rank then keeps 1/4 of a sequence's activations "
                                       "(52.4 GiB predicted)")
    # and what cp costs: the K/V time the chosen variant exposes a step, as the plan predicts it
    trial = parse_config(SHAPE + ["--seq-len", "131072", "--batch-size", "4", "--micro-batches", "auto", "--cp", "4"])
    cp4 = plan_run(trial, trial.validate(4, "cpu", registry.check_model), "cpu", registry.check_model)[1].chosen
    assert cp4.time.cp_comm.name == "ring" and cp4.time.cp_exposed_s > 0
    assert (f"; under --cp 4 its ring K/V transfers expose {cp4.time.cp_exposed_s * 1e3:.1f} ms a step; --cp 4 fits"
            in str(refused.value))


def test_plan_only_ranks_the_grids_beside_a_fixed_cp():
    from hybrid_engine.planner.grids import grid_table

    cfg = parse_config(SHAPE + ["--seq-len", "32768", "--batch-size", "2", "--micro-batches", "auto", "--cp", "2"])
    table = grid_table(cfg, 8, "cpu", registry.check_model)
    rows = [line.split() for line in table.splitlines()[2:] if line.split() and line.split()[0].isdigit()]
    assert {row[1] for row in rows} <= {"4x1x1", "2x2x1", "2x1x2", "1x4x1", "1x2x2", "1x1x4"} and rows
    first = rows[0]  # the fastest: no "why not" after its numbers
    step_ms, rate = float(first[-3]), float(first[-2])
    assert rate == pytest.approx(2 * 32768 / (step_ms / 1e3), rel=0.02)  # the whole sequences' tokens
    with pytest.raises(ConfigError, match="world size 6 is not divisible by --cp 4"):
        grid_table(parse_config(SHAPE + ["--seq-len", "32768", "--cp", "4"]), 6, "cpu", registry.check_model)


LLAMA_1B = ["--model", "llama", "--layers", "16", "--hidden", "2048", "--heads", "32", "--kv-heads", "8",
            "--ffn-hidden", "5632", "--max-positions", "131072", "--amp", "bf16", "--plan-card", "h100",
            "--world-size", "4", "--fused-kernels", "off"]


def _table(capsys, *flags):
    from hybrid_engine import plan

    assert plan.main(LLAMA_1B + list(flags)) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in out if line[:4].strip().isdigit()]
    return out, rows


def test_the_plan_command_ranks_cp_first_for_128k_tokens_and_says_why(capsys):
    out, rows = _table(capsys, "--seq-len", "131072", "--batch-size", "1")
    assert {row[3] for row in rows} == {"1", "2", "4"}  # cp beside the grids: 131072 splits into 2 x 4 chunks
    assert rows[0][3] == "4" and rows[0][1] == "1x1x1"
    # cp 1 keeps every token of the sequence on a rank: on one rank's worth of layers (mp splits some of them) it
    # does not fit; where it fits, a pipeline's stages wait on each other
    unfit = [line for line in out if line.startswith("   -") and line.split()[1:4] == ["1x1x4", "0", "1"]]
    assert unfit and "no plan fits" in unfit[0]
    assert all(row[3] != "1" or "bubble" in " ".join(row) for row in rows)
    verdicts = {line.split(":")[0]: line for line in out if line.startswith("cp ")}
    assert set(verdicts) == {"cp 1", "cp 2", "cp 4"}

    def activations(line: str) -> float:
        return float(line.split("of which ")[1].split()[0])

    assert activations(verdicts["cp 4"]) < activations(verdicts["cp 2"]) < activations(verdicts["cp 1"])
    assert verdicts["cp 4"].startswith("cp 4: row 1 (1x1x1)") and "ring K/V" in verdicts["cp 4"]
    run = out[-1]
    assert run.startswith("run the first: torchrun --nproc_per_node=4 hybrid_engine.py --dp 1 --cp 4 --pp 1 --mp 1 ")
    assert run.count("--cp ") == 1


def test_a_short_sequence_never_ranks_cp_first(capsys):
    for batch, fused in (("4", "off"), ("8", "off"), ("4", "auto"), ("8", "auto")):
        # eager on every row: a cp row's loss is then its K/V traffic (context parallelism is never graphed)
        out, rows = _table(capsys, "--seq-len", "2048", "--batch-size", batch, "--cuda-graphs", "off",
                           "--fused-kernels", fused)
        assert rows[0][3] == "1" and "--cp" not in out[-1]
        assert {row[3] for row in rows} == {"1", "2", "4"}
        # each cp row loses to the dp row of as many tokens per rank by its K/V traffic where the GPU sets the
        # pace (auto: compiled elementwise regions without tp); unfused, the host's operators set it at these
        # tokens a rank (step_time.host_floor), with the transfers under them
        if fused == "auto":
            assert any("K/V" in " ".join(row) for row in rows if row[3] != "1")


def test_a_given_cp_is_kept_and_a_model_without_sequences_has_none():
    from hybrid_engine.planner.context import cp_sizes

    long = parse_config(SHAPE + ["--seq-len", "131072"])
    assert cp_sizes(long, 8, []) == (1, 2, 4, 8)
    assert cp_sizes(long, 12, []) == (1, 2, 4)  # powers of two dividing the world
    assert cp_sizes(parse_config(SHAPE + ["--seq-len", "12"]), 8, []) == (1, 2)  # 2 cp chunks must divide 12
    assert cp_sizes(parse_config(SHAPE + ["--seq-len", "131072", "--cp", "2"]), 8, ["--cp", "2"]) == (2,)
    assert cp_sizes(parse_config(SHAPE + ["--seq-len", "131072"]), 8, ["--cp=1"]) == (1,)
    assert cp_sizes(parse_config(["--model", "mlp"]), 8, []) == (1,)


def test_the_plan_command_takes_a_fixed_cp(capsys):
    out, rows = _table(capsys, "--seq-len", "32768", "--batch-size", "2", "--cp", "2", "--cp-comm", "all-gather")
    assert rows and {row[3] for row in rows} == {"2"} and not any(line.startswith("cp ") for line in out)
    assert all("ring" not in " ".join(row) for row in rows)
    assert " --cp 2 " in out[-1] and "--cp-comm all-gather" in out[-1]
