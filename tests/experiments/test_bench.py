"""experiments/bench/bench.py on CPU + gloo at toy sizes: it runs the engine through the driver and writes the
results file; the runs it plans, its error records and the engine's record from a metrics file; the launcher's
reading of a worker's failure."""
import json
import sys

import pytest

from experiment_programs import EXPERIMENTS, RECORD_KEYS, tiny_first_loss

sys.path.insert(0, str(EXPERIMENTS / "bench"))

import bench  # noqa: E402
import bench_analysis  # noqa: E402
import launch  # noqa: E402


def test_bench_runs_the_engine_through_the_driver_and_writes_the_results_file(tmp_path):
    assert bench.main(["--tiny", "--device", "cpu", "--quick", "--only", "engine", "--precs", "fp32",
                       "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*-2xcpu-quick.json")
    data = json.loads(path.read_text())
    assert {"meta", "runs", "ratios", "ratio_details"} <= data.keys()
    assert {"card", "gpus", "torch", "gemm_peak_tflops", "hbm_copy_gbps", "definitions"} <= data["meta"].keys()
    (run,) = data["runs"]
    assert "error" not in run, run
    assert RECORD_KEYS <= run.keys() and (run["system"], run["mode"], run["pp"]) == ("engine", "1f1b", 2)
    assert run["losses"][0] == pytest.approx(tiny_first_loss(), rel=1e-6)
    assert run["bubble_simulated"] == pytest.approx(1 / 5)  # 1f1b, pp 2, 4 micro-batches: (p-1)/(m+p-1)
    assert 0 <= run["bubble_traced"] < 1 and "--trace" in run["cmd"]  # the driver's own timeline, kept:
    assert (tmp_path / f"{path.stem}-traces" / "L_fp32_1f1b_pp2.json").exists()
    assert set(data["ratios"]) == {t.name for t in bench_analysis.TARGETS}


def test_bench_on_the_cpu_plans_no_fp16_run(capsys):
    """fp16 needs CUDA: --device cpu --quick leaves its runs out (saying so) instead of reporting them as errors."""
    assert bench.main(["--device", "cpu", "--quick", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "fp16 needs CUDA GPUs: its runs are left out on the CPU" in out
    planned = [line for line in out.splitlines() if line.startswith("torchrun")]
    assert planned and not any("fp16" in line for line in planned)


def test_bench_turns_a_flag_the_driver_lacks_into_an_error_record(tmp_path):
    args = bench.parse_args(["--device", "cpu"])
    spec = bench.Spec("engine", "1f1b", "L", "fp16", pp=2, variant="recompute")
    known = {"--dp", "--pp", "--mp", "--schedule", "--dim", "--depth", "--batch-size", "--micro-batches", "--steps",
             "--warmup", "--seed", "--amp", "--device", "--quiet", "--metrics"}
    run = bench.run_one(spec, bench.TINY, args, known, str(tmp_path))
    assert run["error"].startswith("hybrid_engine.py has no --recompute flag")
    assert "--recompute" in bench.command(spec, bench.TINY, device="cpu", metrics="m")
    args.driver_error = "hybrid_engine.py --help failed (exit 1: ImportError: hybrid_engine._C is not built)"
    assert bench.run_one(spec, bench.TINY, args, known, str(tmp_path))["error"] == args.driver_error


def test_engine_record_takes_the_median_after_warmup_and_the_last_peaks(tmp_path):
    metrics = tmp_path / "m.jsonl"
    steps = [(0, 9.0), (1, 0.30), (2, 0.10), (3, 0.20), (4, 0.40)]
    lines = [json.dumps({"step": s, "loss": 1.0 / (s + 1), "step_time_s": t, "peak_mem_gib": [1.0 + s, 2.0],
                         "skipped": s == 1}) for s, t in steps]
    lines.append(json.dumps({"trace": {"measured_bubble": 0.125, "simulated_bubble": 0.1111}}))
    metrics.write_text("\n".join(lines))
    cfg = bench.Config(dim=64, depth=2, batch=128, micro=4, steps=5, warmup=2)
    rec = bench.engine_record(bench.Spec("engine", "1f1b", "L", "fp32", pp=2), cfg, str(metrics))
    assert rec["step_ms"] == pytest.approx(200.0) and rec["samples_s"] == pytest.approx(640.0)
    assert rec["peak_gib"] == [5.0, 2.0] and rec["skipped_steps"] == 1 and rec["losses"][0] == 1.0
    assert rec["bubble_traced"] == 0.125 and len(rec["losses"]) == 5
    assert rec["tflops_per_gpu"] == pytest.approx(6 * 128 * 64 * 64 * 2 / 0.2 / 2 / 1e12, rel=1e-3)


def test_error_line_finds_the_workers_reason_under_torchrun_noise():
    stderr = ("W1126 warnings\nhybrid_engine: rank 1: OutOfMemoryError: CUDA out of memory. Tried to allocate\n"
              "Traceback (most recent call last):\n  File \"/x/torch/distributed/run.py\", line 9\n"
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n")
    assert launch.error_line(stderr, 1) == "exit 1: hybrid_engine: rank 1: OutOfMemoryError: CUDA out of memory. " \
                                           "Tried to allocate"
    assert launch.is_oom(stderr) and not launch.is_oom("hybrid_engine: error: --dim must be >= 1")
