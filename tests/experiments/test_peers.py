"""The course's base code and the torch peer (experiments/peers/) on CPU + gloo at toy sizes: each runs, prints one
JSON record with the shared keys and trains the engine's model (the first loss, taken before any update, is the
model's loss on the first batch)."""
import pytest

from experiment_programs import TINY, check_record, run_program


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
