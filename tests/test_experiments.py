"""The benchmark programs (experiments/) on CPU + gloo at toy sizes: each runs, prints one JSON record with the
shared keys and trains the engine's model (the first loss, taken before any update, is the model's loss on the
first batch); bench.py's derived numbers and max_batch.py's search are checked on synthetic inputs."""
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import bench  # noqa: E402
import bench_analysis  # noqa: E402
import launch  # noqa: E402
import max_batch  # noqa: E402
from engine_reference import first_loss  # noqa: E402

TINY = ["--dim", "32", "--depth", "4", "--batch-size", "16", "--micro-batches", "4", "--steps", "3", "--warmup", "1",
        "--device", "cpu"]
RECORD_KEYS = {"system", "mode", "prec", "gpus", "dp", "pp", "mp", "dim", "depth", "batch", "micro", "step_ms",
               "samples_s", "tflops_per_gpu", "peak_gib", "losses"}


def tiny_first_loss() -> float:
    """Step 0's loss at TINY's shape, before any update: what every system must report first."""
    return first_loss(32, 4, 16)


def run_program(script: str, nproc: int, *args: str) -> dict:
    cmd = launch.torchrun(nproc, launch.free_port()) if nproc > 1 else [sys.executable]
    cmd += [str(EXPERIMENTS / script), *args]
    done = subprocess.run(cmd, cwd=REPO, env=launch.child_env(cpu=True), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, launch.worker_stderr(done.stderr)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, done.stdout  # one record, from rank 0 only
    return json.loads(lines[0])


def check_record(rec: dict, *, system: str, mode: str, prec: str, gpus: int, tol: float) -> None:
    assert RECORD_KEYS <= rec.keys()
    assert (rec["system"], rec["mode"], rec["prec"], rec["gpus"]) == (system, mode, prec, gpus)
    assert rec["timed_steps"] == 2 and rec["step_ms"] > 0 and len(rec["losses"]) == 3
    assert len(rec["peak_gib"]) >= 1 and all(math.isfinite(x) for x in rec["losses"])
    assert rec["losses"][0] == pytest.approx(tiny_first_loss(), rel=tol)


def test_base_code_runs_dp_over_two_cpu_ranks_with_fp16_autocast_and_grad_scaler():
    rec = run_program("baseline_practical10.py", 2, *TINY, "--amp", "fp16")
    check_record(rec, system="base", mode="practical10", prec="fp16", gpus=4, tol=1e-2)
    assert (rec["dp"], rec["pp"]) == (2, 2)


@pytest.mark.parametrize("mode,nproc,amp,prec,tol", [
    ("interleaved", 2, "fp16", "fp16", 1e-2),  # two stages per rank, scaler flags agreed over ranks
    ("tp", 2, "bf16", "bf16", 2e-2),           # DTensor Colwise/Rowwise over 2 ranks
    ("1f1b", 1, "off", "fp32", 1e-6),          # one rank: the schedule without communication
    ("single", 1, "fp16", "fp16", 1e-2),       # the 1-GPU baseline with gradient accumulation
])
def test_peer_mode_runs_on_cpu_and_trains_the_engine_model(mode, nproc, amp, prec, tol):
    rec = run_program("peer_torch_pipelining.py", nproc, "--mode", mode, *TINY, "--amp", amp)
    check_record(rec, system="peer", mode=mode, prec=prec, gpus=nproc, tol=tol)
    if mode == "tp":
        assert rec["mp"] == 2


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


def fake_trials(limit: int, *, gib_per_row: float | None = None, seconds: float = 1.0):
    calls = []

    def trial(batch):
        calls.append(batch)
        peak = 2.0 + gib_per_row * batch if gib_per_row else None
        return max_batch.Trial(batch, "ok" if batch <= limit else "oom", peak_gib=peak, seconds=seconds)
    return trial, calls


@pytest.mark.parametrize("limit", [8, 1000, 12_344, 300_000])
def test_max_batch_search_brackets_the_limit_within_tolerance(limit):
    trial, calls = fake_trials(limit)
    found = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=2**20, tolerance=0.05)
    assert found.converged and found.max_batch <= limit < found.first_failure
    assert found.first_failure - found.max_batch <= max(8, 0.05 * found.max_batch)
    assert all(b % 8 == 0 for b in calls) and len(calls) <= 20


def test_max_batch_search_uses_the_memory_line_to_jump_near_the_limit():
    # 80 GiB card, 2 GiB fixed, limit where the line reaches ~76 GiB (the rest: context, fragmentation)
    trial, calls = fake_trials(limit=296_000, gib_per_row=0.00025)
    found = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=2**20, tolerance=0.05, capacity_gib=80.0)
    blind, blind_calls = fake_trials(limit=296_000)
    max_batch.search_max_batch(blind, quantum=8, start=1024, cap=2**20, tolerance=0.05)
    assert found.max_batch <= 296_000 < found.first_failure
    assert len(calls) < len(blind_calls)


def test_max_batch_search_stops_at_the_cap_on_errors_and_when_the_budget_is_spent():
    trial, _ = fake_trials(10**9)
    capped = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=5003, tolerance=0.05)
    assert capped.max_batch == 5000 and capped.first_failure is None and "cap" in capped.reason

    broken = max_batch.search_max_batch(lambda b: max_batch.Trial(b, "error", message="boom"), quantum=8,
                                        start=1024, cap=2**20)
    assert not broken.converged and broken.max_batch is None and "boom" in broken.reason

    cut = max_batch.search_max_batch(lambda b: max_batch.Trial(b, "ok" if b <= 4096 else "budget"), quantum=8,
                                     start=1024, cap=2**20)  # no capacity known: x4 growth, 1024 -> 4096 -> 16384
    assert (cut.max_batch, cut.first_failure, cut.reason) == (4096, None, "time budget spent")

    clock = iter(range(0, 10**6, 100))  # every look at the clock: 100 s later
    slow, calls = fake_trials(10**6, seconds=100.0)
    out = max_batch.search_max_batch(slow, quantum=8, start=1024, cap=2**20, budget_s=450, clock=lambda: next(clock))
    assert not out.converged and out.reason == "time budget spent" and len(calls) == 4


def test_max_batch_ratios_compare_against_fp32():
    results = {"fp32": {"max_batch": 1000}, "fp16": {"max_batch": 2500}, "fp16-recompute": {"max_batch": 7000}}
    r = max_batch.ratios(results)
    assert r["fp16_over_fp32"] == {"value": 2.5, "target": ">= 2", "met": True}
    assert r["fp16-recompute_over_fp32"]["met"] is False
    assert max_batch.ratios({"fp16": {"max_batch": 5}})["fp16_over_fp32"]["value"] is None


def test_max_batch_runs_a_real_driver_trial_on_cpu(tmp_path):
    assert max_batch.main(["--device", "cpu", "--dim", "32", "--depth", "4", "--micro-batches", "4", "--start", "16",
                           "--cap", "16", "--modes", "fp32", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*-maxbatch.jsonl")
    recs = [json.loads(ln) for ln in path.read_text().splitlines()]
    trial = next(r for r in recs if r["kind"] == "trial")
    assert trial["status"] == "ok" and trial["batch"] == 16 and "--batch-size 16" in trial["cmd"]
    result = next(r for r in recs if r["kind"] == "result")
    assert result["max_batch"] == 16 and "cap" in result["reason"]
    assert recs[-1]["kind"] == "ratios"


def test_max_batch_skips_a_mode_whose_flag_the_driver_lacks():
    assert launch.missing_flags(["hybrid_engine.py", "--amp", "fp16", "--recompute"], {"--amp"}) == ["--recompute"]
    assert launch.missing_flags(["hybrid_engine.py", "--amp", "fp16"], {"--amp"}) == []


# ---- max_batch.py: the search on a linear memory model (no GPU), the memory model, the launcher's failures

def linear_memory(a: float, b: float, capacity: float, *, frag: float = 0.0, noise: float = 0.003, seed: int = 0,
                  transient: tuple[int, ...] = ()):
    """A fake trial runner: peak = a + b * batch (+ Gaussian noise on the reported peak, rounded like the driver's
    records); out of memory where the true peak passes (1 - frag) x capacity (fragmentation, context); the
    calls numbered in `transient` (1-based) fail like a port clash instead."""
    rng = random.Random(seed)
    calls = []

    def trial(batch):
        calls.append(batch)
        if len(calls) in transient:
            return max_batch.Trial(batch, "transient", seconds=4.6, message="exit 1: DistNetworkError: EADDRINUSE")
        peak = a + b * batch
        if peak > capacity * (1 - frag):
            return max_batch.Trial(batch, "oom", seconds=20.0)
        return max_batch.Trial(batch, "ok", peak_gib=round(peak + rng.gauss(0, noise), 3), seconds=20.0)

    def limit(quantum=8):  # the true largest passing batch
        return int((capacity * (1 - frag) - a) / b) // quantum * quantum
    return trial, calls, limit()


KB = 1e3 / 2**30  # GiB per KB
SETTINGS = [  # (a GiB, b GiB per row, capacity GiB): 8 GiB caps at the shapes of the GPU run, 80 and 140 GiB cards
    (2.06, 55.3 * KB, 8.0), (1.8, 27.6 * KB, 8.0), (1.8, 26.6 * KB, 8.0), (2.0, 0.00025, 80.0),
    (20.0, 1e-4, 139.8), (0.5, 2e-6, 8.0), (3.0, 300 * KB, 8.0)]


@pytest.mark.parametrize("a,b,capacity", SETTINGS)
@pytest.mark.parametrize("frag", [0.0, 0.02])
@pytest.mark.parametrize("hint_error", [0.5, 1.0, 2.0])  # the memory model's slope, off by this factor
def test_max_batch_search_converges_within_3_percent_in_at_most_6_trials(a, b, capacity, frag, hint_error):
    for seed in range(3):
        trial, calls, limit = linear_memory(a, b, capacity, frag=frag, seed=seed)
        found = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=2**22, tolerance=0.03,
                                           capacity_gib=capacity, row_gib_hint=b * hint_error,
                                           fixed_gib_hint=0.8 * a)
        assert found.converged and found.max_batch <= limit < found.first_failure, (calls, limit)
        assert found.first_failure - found.max_batch <= max(8, 0.03 * found.max_batch)
        assert len(calls) <= 6, (calls, limit)
        assert all(x % 8 == 0 for x in calls) and len(set(calls)) == len(calls)
        # the result carries the fitted line and its prediction
        assert found.fit["b_gib_per_row"] == pytest.approx(b, rel=0.03) and found.fit["points"] >= 2
        assert found.fit["a_gib"] == pytest.approx(a, abs=0.05)
        assert found.predicted_max == pytest.approx((capacity - a) / b, rel=0.03)


def test_max_batch_search_without_the_model_still_converges_and_the_old_run_would_have():
    # the 2026-11-26 run: 8 GiB cap, fp32 a ~ 2.06 GiB; without any hint, and with the capacity the GPU's size
    # (the old bug: 139.8 GiB instead of the cap) the search still brackets the limit, only later
    for capacity_seen in (8.0, None):
        trial, calls, limit = linear_memory(2.06, 55.3 * KB, 8.0)
        found = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=2**22, tolerance=0.03,
                                           capacity_gib=capacity_seen)
        assert found.converged and found.max_batch <= limit < found.first_failure
        assert len(calls) <= (7 if capacity_seen else 16), calls


@pytest.mark.parametrize("a,b,capacity", SETTINGS[:4])
def test_max_batch_search_two_per_round_needs_at_most_3_rounds(a, b, capacity, monkeypatch):
    rounds = []
    plan_round = max_batch.plan_round
    monkeypatch.setattr(max_batch, "plan_round", lambda *x, **k: rounds.append(plan_round(*x, **k)) or rounds[-1])
    for hint_error in (0.5, 1.0, 2.0):
        rounds.clear()
        trial, calls, limit = linear_memory(a, b, capacity, frag=0.01)
        found = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=2**22, capacity_gib=capacity,
                                           row_gib_hint=b * hint_error, fixed_gib_hint=0.8 * a, width=2)
        assert found.converged and found.max_batch <= limit < found.first_failure
        ran = [r for r in rounds if r]
        assert len(ran) <= 3 and all(len(r) <= 2 for r in ran), ran
        assert sorted(calls) == sorted(x for r in ran for x in r)


def test_max_batch_search_retries_a_transient_launcher_failure_once_on_the_same_batch():
    trial, calls, limit = linear_memory(2.06, 55.3 * KB, 8.0, transient=(2,))
    found = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=2**22, capacity_gib=8.0,
                                       row_gib_hint=55.3 * KB)
    assert found.converged and found.max_batch <= limit < found.first_failure
    assert calls[1] == calls[2]  # the port clash, then the same batch again
    assert [t.status for t in found.trials].count("transient") == 1 and len(calls) <= 7

    trial, calls, _ = linear_memory(2.06, 55.3 * KB, 8.0, transient=(2, 3))  # twice in a row: a real error
    found = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=2**22, capacity_gib=8.0)
    assert not found.converged and "launcher failed twice" in found.reason and len(calls) == 3
    assert found.max_batch == 1024


def test_memory_model_of_the_gpu_run_shape():
    def row_d(schedule, half, recompute, streamed=False, micro=8):
        m = max_batch.memory_model(dim=4096, depth=16, pp=2, micro_batches=micro, schedule=schedule, half=half,
                                   recompute=recompute, streamed=streamed)
        return m["row_bytes"] / 4096, m["bound_by_stage"]
    # 1F1B: stage 0 holds 2 micro-batches, the last stage 1; bytes per row in units of dim. The last stage keeps
    # each in-flight micro-batch's output gradient (computed with the loss) until its backward.
    assert row_d("1f1b", False, False) == (13.5, 0)
    assert row_d("1f1b", True, False) == (6.75, 0)
    # With recompute a native stage keeps only its input: it drops its output once sent, and the last stage runs
    # its forward and loss in the backward (no output gradient kept).
    assert row_d("1f1b", True, True) == (5.75, 1)
    assert row_d("gpipe", False, False) == (46.5, 1)
    assert row_d("gpipe", True, False) == (23.5, 1)
    assert row_d("gpipe", True, True) == (7.5, 1)
    # streamed data: only in-flight inputs on stage 0, one micro-batch of targets at a time on the last stage
    assert row_d("1f1b", False, False, streamed=True) == (10.5, 0)
    assert row_d("1f1b", True, True, streamed=True) == (4.0, 1)
    assert row_d("gpipe", True, True, streamed=True, micro=16) == (3.875, 1)
    args = max_batch.parse_args(["--dim", "4096"])
    assert "x fp32 2.35" in max_batch.model_table(args)  # the slopes' ratio fp16-recompute / fp32 under 1F1B
    args = max_batch.parse_args(["--dim", "4096", "--driver-args=--stream-data"])
    assert "x fp32 2.62" in max_batch.model_table(args)


def test_memory_model_of_zero1_over_two_pipelines():
    shape = dict(dim=4096, depth=16, pp=2, micro_batches=8, schedule="1f1b", half=True, recompute=False)
    one, two, zero = (max_batch.memory_model(**shape, **extra) for extra in ({}, {"dp": 2}, {"dp": 2, "zero": 1}))
    assert two["row_bytes"] == one["row_bytes"] / 2  # each pipeline runs half the global batch's rows
    params = 8 * (4096 * 4096 + 4096)
    assert one["fixed_bytes"] == two["fixed_bytes"] == params * (2 + 4 + 4 + 4)
    assert zero["fixed_bytes"] == params * (2 + 4 + (4 + 4) / 2)  # masters and the optimizer's share halve
    with pytest.raises(SystemExit, match="--zero 1 shards over the DP replicas"):
        max_batch.main(["--device", "cpu", "--zero", "1", "--modes", "fp32"])


def test_max_batch_runs_a_zero1_trial_over_two_pipelines_on_cpu(tmp_path):
    assert max_batch.main(["--device", "cpu", "--dim", "32", "--depth", "4", "--pp", "1", "--dp", "2", "--zero", "1",
                           "--micro-batches", "2", "--start", "16", "--cap", "16", "--modes", "fp32",
                           "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*-maxbatch.jsonl")
    recs = [json.loads(ln) for ln in path.read_text().splitlines()]
    trial = next(r for r in recs if r["kind"] == "trial")
    assert trial["status"] == "ok" and "--dp 2 --zero 1" in trial["cmd"] and "nproc_per_node=2" in trial["cmd"]
    result = next(r for r in recs if r["kind"] == "result")
    assert result["max_batch"] == 16 and (result["dp"], result["zero"]) == (2, 1)


def test_launcher_failures_are_transient_and_the_memory_cap_is_the_capacity():
    clash = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
             "address. port: 42551, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
    assert launch.is_transient(clash) and not launch.is_oom(clash)
    assert not launch.is_transient("hybrid_engine: rank 0: OutOfMemoryError: CUDA out of memory")
    assert not launch.is_transient("hybrid_engine: error: --dim must be >= 1")
    assert len({launch.free_port() for _ in range(20)}) == 20
    assert max_batch.memory_cap("--memory-cap-gib 8") == 8.0 and max_batch.memory_cap("--foo --memory-cap-gib=7.5") == 7.5
    assert max_batch.memory_cap("") is None


FAKE_DRIVER = '''
import json, os, sys
if "--help" in sys.argv:
    print("--pp --schedule --dim --depth --batch-size --micro-batches --steps --warmup --comm-timeout --quiet "
          "--metrics --amp --device --memory-cap-gib")
    sys.exit(0)
arg = lambda name: sys.argv[sys.argv.index(name) + 1]
batch, marker = int(arg("--batch-size")), os.environ["FAKE_MARKER"]
if os.environ.get("RANK") == "0":
    if not os.path.exists(marker):  # the first launch of all: the launcher's port clash
        open(marker, "w").close()
        sys.exit("torch.distributed.DistNetworkError: failed to listen: EADDRINUSE, message: address already in use")
    if batch > 40:
        sys.exit("hybrid_engine: rank 0: OutOfMemoryError: CUDA out of memory")
    with open(arg("--metrics"), "w") as f:
        for step in range(int(arg("--steps"))):
            f.write(json.dumps({"step": step, "loss": 1.0, "peak_mem_gib": [1.0 + batch / 100, 0.5]}) + "\\n")
'''


# torchrun's part in a trial (one process per rank, RANK set, the worst exit code) without its seconds of start-up
# per trial: the real torchrun runs in the two real-driver trials above
FAKE_TORCHRUN = '''
import os, subprocess, sys
nproc, script = int(sys.argv[1]), sys.argv[2:]
ranks = [subprocess.Popen([sys.executable, *script], env={**os.environ, "RANK": str(r)}) for r in range(nproc)]
sys.exit(max(p.wait() for p in ranks))
'''


def test_max_batch_main_retries_a_port_clash_and_runs_modes_together(tmp_path, monkeypatch):
    driver = tmp_path / "fake_driver.py"
    driver.write_text(FAKE_DRIVER)
    launcher = tmp_path / "fake_torchrun.py"
    launcher.write_text(FAKE_TORCHRUN)
    monkeypatch.setattr(max_batch, "torchrun", lambda nproc, port: [sys.executable, str(launcher), str(nproc)])
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "clashed"))
    assert max_batch.main(["--device", "cpu", "--driver", str(driver), "--modes", "fp32,bf16", "--parallel", "4",
                           "--micro-batches", "4", "--start", "16", "--cap", "64", "--capacity-gib", "1.4",
                           "--tolerance", "0.1", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*-maxbatch.jsonl")
    recs = [json.loads(ln) for ln in path.read_text().splitlines()]
    trials = [r for r in recs if r["kind"] == "trial"]
    assert [t["status"] for t in trials].count("transient") == 1  # retried, not the end of the mode
    results = {r["mode"]: r for r in recs if r["kind"] == "result"}
    for mode in ("fp32", "bf16"):  # the fake fits 40 rows: 1.4 GiB at 1 + batch / 100
        r = results[mode]
        assert (r["max_batch"], r["first_failure"], r["converged"]) == (40, 44, True), r
        assert r["fit"]["b_gib_per_row"] == pytest.approx(0.01) and r["predicted_max"] == 40
        assert r["capacity_gib"] == 1.4 and r["trials"] <= 8
    assert recs[-1]["kind"] == "ratios"


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


def test_the_cpp_mse_keeps_no_per_row_memory_on_the_last_stage(tmp_path):
    """experiments/memory_per_row.py on two gloo ranks (bf16 half weights, pp=2): the last stage's bytes per batch
    row with the C++ MSE are 4 D below those of mse_loss(out.float(), target.float()), whose every micro-batch
    kept its whole fp32 unreduced loss (a 0-dim mean shares that storage) to the end of the step."""
    slopes = {}
    for loss in ("mse", "python"):
        out = tmp_path / f"{loss}.json"
        run = subprocess.run([sys.executable, str(EXPERIMENTS / "memory_per_row.py"), "--modes", "bf16",
                              "--loss", loss, "--json", str(out)], capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stderr[-2000:]
        ranks = json.loads(out.read_text())["modes"]["bf16"]
        slopes[loss] = {int(r): v["slope_d"] for r, v in ranks.items()}
    assert slopes["mse"][0] == pytest.approx(slopes["python"][0], abs=0.05)  # the first stage has no loss
    assert slopes["python"][1] - slopes["mse"][1] >= 3.5, slopes
