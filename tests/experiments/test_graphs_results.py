"""The graphs pass's results file (experiments/analysis/graphs_results.py) from synthetic sweeps: each grid's step
with graphs on against off, each against one GPU at the same micro-batches, and the targets for config L."""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments" / "analysis"))

import graphs_results  # noqa: E402


def _run(grid: str, config: str, m: int, graphs: str, ms: float, loss: float = 0.5) -> dict:
    return {"grid": grid, "config": config, "micro_batches": m, "graphs": graphs, "graphed": graphs == "on",
            "median_step_ms": ms, "last_loss": loss}


def test_the_results_file_compares_on_with_off_and_every_grid_with_one_gpu(tmp_path, capsys, monkeypatch):
    one = [_run("dp1 pp1 mp1", "L", 8, "off", 20.0), _run("dp1 pp1 mp1", "L", 8, "on", 16.0),
           _run("dp1 pp1 mp1", "L", 1, "off", 12.0), _run("dp1 pp1 mp1", "L", 1, "on", 10.0)]
    four = [_run("dp1 pp4 mp1", "L", 8, "off", 10.0), _run("dp1 pp4 mp1", "L", 8, "on", 5.0, 0.5000001),
            _run("dp1 pp1 mp4", "L", 1, "off", 8.0), _run("dp1 pp1 mp4", "L", 1, "on", 6.0)]
    sweeps = []
    for name, runs in (("sweep1.json", one), ("sweep4.json", four)):
        (tmp_path / name).write_text(json.dumps(runs))
        sweeps.append(str(tmp_path / name))
    out = tmp_path / "graphs.json"
    monkeypatch.setattr(sys, "argv", ["graphs_results.py", str(out), *sweeps, str(tmp_path / "missing.json"),
                                      "--card", "NVIDIA H100", "--torch", "2.13"])
    assert graphs_results.main() == 0
    result = json.loads(out.read_text())
    rows = {(r["grid"], r["micro_batches"]): r for r in result["comparisons"]}
    pp4, mp4 = rows[("dp1 pp4 mp1", 8)], rows[("dp1 pp1 mp4", 1)]
    assert pp4["on_speedup"] == 2.0 and pp4["vs_1gpu_off"] == 2.0 and pp4["vs_1gpu_on"] == 3.2
    assert pp4["target_vs_1gpu"] == 2.5 and pp4["met"]
    assert abs(pp4["last_loss_rel_diff"] - 2e-7) < 1e-9
    assert mp4["on_speedup"] == 1.333 and mp4["vs_1gpu_on"] == 1.667 and not mp4["met"]
    assert rows[("dp1 pp1 mp1", 8)]["on_speedup"] == 1.25 and "vs_1gpu_on" not in rows[("dp1 pp1 mp1", 8)]
    assert len(result["runs"]) == 8 and result["meta"]["card"] == "NVIDIA H100"
    printed = capsys.readouterr().out
    assert "target 2.5x met" in printed and "target 2.0x NOT met" in printed


def test_the_sweep_runs_every_one_gpu_setting_off_and_replayed_on_the_cpu(tmp_path):
    import os
    import subprocess

    from launch_utils import free_port

    out = tmp_path / "sweep1.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1",
                           f"--master_port={free_port()}", str(REPO / "experiments" / "bench" / "graphs_sweep.py"),
                           "--out", str(out), "--device", "cpu", "--tiny", "--steps", "3", "--warmup", "1",
                           "--configs", "C"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(out.read_text())
    assert [(r["micro_batches"], r["graphs"]) for r in runs] == [(m, g) for m in (1, 4, 8) for g in ("off", "on")]
    for off, on in zip(runs[::2], runs[1::2]):
        assert on["graphed"] and on["host_replay"] and not off["graphed"]
        assert on["last_loss"] == off["last_loss"] and len(on["steps_ms"]) == 3


def test_a_failed_run_is_kept_with_its_error_and_compared_with_nothing(tmp_path, monkeypatch):
    runs = [_run("dp1 pp1 mp4", "C", 1, "off", 8.0),
            {"grid": "dp1 pp1 mp4", "config": "C", "micro_batches": 1, "graphs": "on", "error": "RuntimeError: x"}]
    (tmp_path / "sweep4.json").write_text(json.dumps(runs))
    out = tmp_path / "graphs.json"
    monkeypatch.setattr(sys, "argv", ["graphs_results.py", str(out), str(tmp_path / "sweep4.json")])
    assert graphs_results.main() == 0
    result = json.loads(out.read_text())
    assert result["comparisons"] == [] and result["runs"][1]["error"] == "RuntimeError: x"
