"""The fp8 linear bench's kept records (experiments/results/2026-11-27-1xH200-fp8-linear-bench.jsonl) are the JSON
lines its device call printed (raw/2026-11-27-4xH200-fp8-kernels-test-linear-bench.tgz: c2/fp8_linear.log), one per
shape and recipe, each record's summary its own parts' sum."""
import json
import tarfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"


def test_the_kept_records_are_the_lines_the_bench_printed():
    with tarfile.open(RESULTS / "raw" / "2026-11-27-4xH200-fp8-kernels-test-linear-bench.tgz") as archive:
        log = archive.extractfile("c2/fp8_linear.log").read().decode()
    printed = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    kept = [json.loads(line) for line in (RESULTS / "2026-11-27-1xH200-fp8-linear-bench.jsonl").read_text().splitlines()]
    assert kept == printed and len(kept) == 6
    assert {(r["k"], r["n"], r["recipe"]) for r in kept} == {
        (k, n, recipe) for k, n in ((4096, 14336), (14336, 4096), (4096, 4096)) for recipe in ("tensorwise", "rowwise")}
    for r in kept:
        gemms = sum(v for k, v in r["ms"].items() if k.startswith("fp8 GEMM"))
        assert abs(r["fp8_gemms_ms"] - gemms) < 1e-3 and r["gpu_kernels"] and r["native"]
