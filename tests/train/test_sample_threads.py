"""sample decodes one sequence a token at a time: a small model on several threads spends more in their hand-offs
than it saves (1.6-14 s for 300 tokens on a busy 2-core machine, 1.7 s on one thread), so it takes a thread per
16M parameters, says so once, and leaves a user's OMP_NUM_THREADS alone."""
import torch

from checkpoint_fakes import write_gpt_checkpoint
from hybrid_engine.train import sample


def _sample_with(tmp_path, capsys, monkeypatch, omp: str | None, threads_before: int) -> tuple[int, str]:
    path = write_gpt_checkpoint(tmp_path / "ckpt")
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads_before)
    try:
        assert sample.main(["--load", path, "--prompt", "ab", "--tokens", "2"]) == 0
        return torch.get_num_threads(), capsys.readouterr().err
    finally:
        torch.set_num_threads(saved)


def test_a_small_model_samples_on_one_thread_and_says_so_once(tmp_path, capsys, monkeypatch):
    threads, err = _sample_with(tmp_path, capsys, monkeypatch, None, 2)
    assert threads == 1
    assert err.count("\n") == 1 and err.startswith("sample: 1 CPU thread for 0.") and "OMP_NUM_THREADS" in err, err


def test_omp_num_threads_stands(tmp_path, capsys, monkeypatch):
    threads, err = _sample_with(tmp_path, capsys, monkeypatch, "2", 2)
    assert threads == 2 and err == ""
