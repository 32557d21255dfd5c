"""experiments/bench/max_batch.py around its search: real driver trials on CPU + gloo, a fake driver and launcher
for the port clash and modes run side by side, the ratios against fp32, and the launcher's failures; the memory
model (experiments/bench/memory_model.py) of the GPU run's shape, and the bytes per row that
experiments/bench/memory_per_row.py measures."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "experiments"
sys.path.insert(0, str(EXPERIMENTS / "bench"))

import launch  # noqa: E402
import max_batch  # noqa: E402


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
    try:  # the first launch of all (created atomically: the modes' first launches run at once): a port clash
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        pass
    else:
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


def test_the_cpp_mse_keeps_no_per_row_memory_on_the_last_stage(tmp_path):
    """experiments/bench/memory_per_row.py on two gloo ranks (bf16 half weights, pp=2): the last stage's bytes per batch
    row with the C++ MSE are 4 D below those of mse_loss(out.float(), target.float()), whose every micro-batch
    kept its whole fp32 unreduced loss (a 0-dim mean shares that storage) to the end of the step."""
    slopes = {}
    for loss in ("mse", "python"):
        out = tmp_path / f"{loss}.json"
        run = subprocess.run([sys.executable, str(EXPERIMENTS / "bench" / "memory_per_row.py"), "--modes", "bf16",
                              "--loss", loss, "--json", str(out)], capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stderr[-2000:]
        ranks = json.loads(out.read_text())["modes"]["bf16"]
        slopes[loss] = {int(r): v["slope_d"] for r, v in ranks.items()}
    assert slopes["mse"][0] == pytest.approx(slopes["python"][0], abs=0.05)  # the first stage has no loss
    assert slopes["python"][1] - slopes["mse"][1] >= 3.5, slopes
