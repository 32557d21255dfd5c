"""python -m hybrid_engine.schedule: the grid, the numbers, the picture, and one-line errors."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hybrid_engine.schedule import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybrid_engine.schedule", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_cli_prints_1f1b_grid_bubble_3_over_11_and_peaks():
    out = run_cli("--schedule", "1f1b", "--pp", "4", "--micro-batches", "8")
    assert out.returncode == 0, out.stderr
    assert "rank 0 | 0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7" in out.stdout
    assert "makespan 33, bubble 0.273 (3/11)" in out.stdout
    peaks = [int(line.split()[-1]) for line in out.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert peaks == [4, 3, 2, 1]


def test_cli_bad_input_is_one_line_and_exit_2():
    out = run_cli("--schedule", "interleaved", "--pp", "4", "--micro-batches", "6", "--virtual-stages", "2")
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "python -m hybrid_engine.schedule: error: interleaved needs micro-batches to be a multiple of pp "
        "(got micro-batches=6, pp=4)"
    ]


@pytest.mark.parametrize("args,message", [
    (["--schedule", "pipedream", "--pp", "2", "--micro-batches", "4"], "invalid choice: 'pipedream'"),
    (["--schedule", "1f1b", "--pp", "0", "--micro-batches", "4"], "pp must be >= 1 (got 0)"),
    (["--schedule", "1f1b", "--pp", "2", "--micro-batches", "4", "--costs", "1,2,x,1"], "--costs wants numbers"),
    (["--schedule", "1f1b", "--pp", "2", "--micro-batches", "4", "--costs", "1,2"], "four non-negative numbers"),
    (["--schedule", "1f1b", "--pp", "2", "--micro-batches", "4", "--latency", "-1"], "--latency must be >= 0"),
    (["--schedule", "1f1b", "--pp", "two", "--micro-batches", "4"], "invalid int value: 'two'"),
    (["--pp", "2", "--micro-batches", "4"], "the following arguments are required: --schedule"),
    (["--schedule", "gpipe", "--pp", "2", "--micro-batches", "4", "--lookahead", "1"],
     "--lookahead applies to --schedule 1f1b and zb1 only (got gpipe)"),
])
def test_cli_rejects_bad_arguments_in_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err


def test_cli_zb1_numbers(capsys):
    assert main(["--schedule", "zb1", "--pp", "4", "--micro-batches", "8"]) == 0
    out = capsys.readouterr().out
    assert "makespan 27, bubble 0.111 (1/9)" in out
    assert "0I0 0W0" in out


def test_cli_interleaved_costs_a_chunk_1_over_v(capsys):
    assert main(["--schedule", "interleaved", "--pp", "4", "--micro-batches", "8", "--virtual-stages", "2"]) == 0
    out = capsys.readouterr().out
    assert "makespan 28.5, bubble 0.158 (3/19)" in out  # same work per rank as 1F1B's 33, less bubble


def test_cli_latency_and_comms(capsys):
    assert main(["--schedule", "1f1b", "--pp", "2", "--micro-batches", "1", "--latency", "0.5", "--comms"]) == 0
    out = capsys.readouterr().out
    assert "rank 0 | 0F0      0SEND_F0 0RECV_B0 0B0" in out
    assert "makespan 7," in out


def test_cli_draws_the_timeline_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "timeline.png"
    assert main(["--schedule", "interleaved", "--pp", "2", "--micro-batches", "4", "--virtual-stages", "2",
                 "--png", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert f"timeline written to {path}" in capsys.readouterr().out


def test_draw_timeline_takes_measured_rows(tmp_path):
    pytest.importorskip("matplotlib")
    from hybrid_engine.metrics.timeline import draw_timeline

    rows = [[(0.0, 1.5, "F", 0, 0), (2.0, 5.0, "B", 0, 0)], [(1.6, 3.0, "F", 1, 0), (3.0, 4.0, "SEND", 1, 0)]]
    path = tmp_path / "measured.svg"
    draw_timeline(rows, str(path), title="measured", time_label="time (ms)")
    assert "measured" in path.read_text()


def test_cli_lookahead_runs_forwards_ahead_and_hides_latency(capsys):
    args = ["--schedule", "1f1b", "--pp", "2", "--micro-batches", "4", "--latency", "0.5"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--lookahead", "1"]) == 0
    ahead = capsys.readouterr().out
    assert "rank 0 | 0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3" in ahead
    assert "makespan 16," in ahead and "makespan 16," not in plain  # the plain schedule waits on each round trip
    assert ahead.splitlines()[-2].split()[-1] == "3"  # rank 0 holds one more micro-batch
