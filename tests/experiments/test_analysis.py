"""The derived numbers of the results files on synthetic runs: bench_analysis.py's ratios, MFU and bubbles
(experiments/bench/), and merge_results.py (experiments/analysis/), which never pairs runs of different jobs."""
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "experiments"
sys.path.insert(0, str(EXPERIMENTS / "bench"))
sys.path.insert(0, str(EXPERIMENTS / "analysis"))

import bench_analysis  # noqa: E402


def synthetic_run(system, mode, config, prec, samples_s, *, dp=1, pp=1, mp=1, variant="", micro=8, tflops=100.0):
    batch = 1024
    return {"system": system, "mode": mode, "config": config, "prec": prec, "dp": dp, "pp": pp, "mp": mp,
            "variant": variant, "gpus": (2 * dp if system == "base" else dp * pp * mp), "micro": micro,
            "batch": batch, "samples_s": samples_s, "step_ms": 1e3 * batch / samples_s, "tflops_per_gpu": tflops}


def test_ratios_use_the_fastest_engine_schedule_and_leave_missing_runs_null():
    runs = [
        synthetic_run("base", "practical10", "L", "fp16", 1000, pp=2),
        synthetic_run("peer", "1f1b", "L", "fp16", 2000, pp=2),
        {**synthetic_run("engine", "1f1b", "L", "fp16", 6000, pp=2), "bubble_traced": 0.12},
        synthetic_run("engine", "zb1", "L", "fp16", 7000, pp=2),
        synthetic_run("engine", "1f1b", "L", "fp16", 9000, pp=2, variant="autocast"),  # not the default: ignored
        {**synthetic_run("engine", "gpipe", "L", "fp16", 99999, pp=2), "error": "exit 1"},  # failed: ignored
        synthetic_run("engine", "single", "L", "fp16", 3600),
        synthetic_run("engine", "dp", "L", "fp16", 6840, dp=2),
        synthetic_run("peer", "tp", "L", "fp16", 500, mp=2),
        synthetic_run("engine", "tp", "L", "fp16", 1600, mp=2),
        synthetic_run("peer", "1f1b", "X", "fp16", 100000, pp=2),
        synthetic_run("engine", "1f1b", "X", "fp16", 150000, pp=2, tflops=640.0),
    ]
    meta = {"gemm_peak_tflops": {"fp16": 800.0, "fp32": 50.0}}
    bench_analysis.annotate(runs, meta["gemm_peak_tflops"], "NVIDIA H200")
    ratios, details = bench_analysis.compute_ratios(runs, meta)
    assert ratios["L_pp2_fp16_vs_peer_1f1b"] == pytest.approx(3.5)
    assert ratios["L_pp2_fp16_vs_base"] == pytest.approx(7.0)
    assert details["L_pp2_fp16_vs_peer_1f1b"]["met"] is True and "zb1" in details["L_pp2_fp16_vs_peer_1f1b"]["engine"]
    assert ratios["L_mp2_fp16_vs_peer_tp"] == pytest.approx(3.2)
    assert ratios["L_dp2_fp16_scaling_efficiency"] == pytest.approx(0.95)
    assert ratios["X_pp2_fp16_vs_peer_1f1b"] == pytest.approx(1.5)
    # X: 640 TFLOP/s of an 800 peak with a simulated 1f1b bubble of 1/9
    assert ratios["X_pp2_fp16_of_peak_x_1_minus_bubble"] == pytest.approx(640 / (800 * 8 / 9))
    # L 1f1b: T_1gpu / (pp * T_step) = (1/3600) / (2/6000) -> bubble 1/6 against a simulated 1/9
    assert ratios["L_pp2_fp16_1f1b_bubble_measured_over_simulated"] == pytest.approx((1 / 6) / (1 / 9), rel=1e-3)
    assert details["L_pp2_fp16_1f1b_bubble_measured_over_simulated"]["met"] is False
    assert ratios["L_pp2_fp16_1f1b_bubble_traced_over_simulated"] == pytest.approx(0.12 * 9, rel=1e-3)
    for missing in ("L_pp2_fp32_vs_base", "C_pp2_fp16_vs_peer_1f1b", "L_mp2_bf16_vs_peer_tp"):
        assert ratios[missing] is None and details[missing]["met"] is None
    assert runs[0]["bubble_simulated"] == pytest.approx(0.5)  # the base code is stop-and-wait
    assert runs[2]["gemm_fraction"] == pytest.approx(100 / 800)  # of the measured GEMM rate: not MFU
    assert runs[2]["mfu"] == pytest.approx(100 / 989, abs=1e-4)  # MFU: of the datasheet's dense fp16 peak
    assert runs[-1]["mfu"] == pytest.approx(640 / 989, abs=1e-4) and runs[-1]["gemm_fraction"] == pytest.approx(640 / 800)
    unknown = [synthetic_run("engine", "1f1b", "L", "fp16", 6000, pp=2)]
    bench_analysis.annotate(unknown, meta["gemm_peak_tflops"], "cpu")
    assert unknown[0]["mfu"] is None  # no datasheet peak for the card: no MFU
    table = bench_analysis.format_table(runs, ratios, details)
    assert "ERROR: exit 1" in table and "L_pp2_fp16_vs_peer_1f1b" in table


def test_merged_ratios_never_compare_runs_of_different_jobs(tmp_path):
    """A later job that re-times only the 1-GPU run must not pair it with an earlier job's dp=2 run; each ratio
    comes whole from the newest job that measured both of its sides."""
    import merge_results

    first = [synthetic_run("engine", "single", "L", "fp16", 3600), synthetic_run("engine", "dp", "L", "fp16", 6840, dp=2)]
    later = [synthetic_run("engine", "single", "L", "fp16", 4000),
             synthetic_run("engine", "dp", "Lw", "fp16", 7200, dp=2),  # weak scaling: both sides in this job
             synthetic_run("base", "practical10", "L", "fp16", 1000, pp=2),
             synthetic_run("engine", "zb1", "L", "fp16", 6000, pp=2)]
    paths = []
    for name, runs in (("job1.json", first), ("job2.json", later)):
        (tmp_path / name).write_text(json.dumps({"meta": {"gemm_peak_tflops": {}}, "runs": runs}))
        paths.append(tmp_path / name)
    merged = merge_results.merge(paths)
    assert merged["ratios"]["L_dp2_fp16_scaling_efficiency"] == pytest.approx(6840 / 7200)  # job 1's pair
    assert merged["ratio_details"]["L_dp2_fp16_scaling_efficiency"]["source"] == "job1.json"
    assert merged["ratios"]["L_dp2_fp16_weak_scaling_efficiency"] == pytest.approx(0.9)  # job 2's pair
    assert merged["ratios"]["L_pp2_fp16_vs_base"] == pytest.approx(6.0)
    single = [r for r in merged["runs"] if r["mode"] == "single"]
    assert len(single) == 1 and single[0]["samples_s"] == 4000 and single[0]["source"] == "job2.json"
