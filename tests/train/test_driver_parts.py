"""The driver's parts that need no process group, in this process: one line per error however many ranks find
it, progress lines and the summary of a resumed run, output paths checked
before setup, and the fault plan read from the documented test variables."""
import io
import threading

import pytest
import torch.distributed as dist

from hybrid_engine.train.cli import parse_config
from hybrid_engine.config import ConfigError
from hybrid_engine.runtime import exit_together
from hybrid_engine.runtime.exit_together import agree_on_error, answer_the_waiting
from hybrid_engine.runtime.fault_plan import FaultPlan
from hybrid_engine.train.progress import Progress, summary_line
from hybrid_engine.config.output_paths import check_output_paths
from hybrid_engine.train.trainer import RunState

from launch_utils import free_port


def agree(monkeypatch, messages: list[str], grace_s: float = 10.0) -> list[tuple[bool, bool]]:
    """agree_on_error on len(messages) 'ranks' (threads) against a real store."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, len(messages), is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", f"test-{port}")
    out: list = [None] * len(messages)

    def rank(r: int) -> None:
        out[r] = agree_on_error(r, len(messages), messages[r], grace_s=grace_s)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(messages))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    del store
    return out


def test_an_error_every_rank_finds_alike_is_spoken_by_the_lowest_rank_alone(monkeypatch):
    assert agree(monkeypatch, ["bad grid"] * 4) == [(True, True), (False, True), (False, True), (False, True)]


def test_a_rank_with_its_own_error_speaks_for_itself(monkeypatch):
    assert agree(monkeypatch, ["bad grid", "bad grid", "no GPU 2"]) == [(True, False), (False, False), (True, False)]


def test_a_rank_left_alone_speaks_after_the_grace_period(monkeypatch):
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", f"alone-{port}")
    assert agree_on_error(1, 2, "LOCAL_RANK 'x'", grace_s=0.5) == (True, False)
    del store


def test_the_rank_serving_the_store_answers_a_rank_waiting_at_the_agreement_before_it_leaves(monkeypatch):
    """Ranks by hand: rank 1 left on an error of its own and waits for rank 0's check-in; rank 0 then fails on its
    own (a timeout: no agreement of its own) and, serving the store, answers rank 1 and waits for its read, so
    rank 1 neither waits out its grace nor loses the store mid-read. Nobody waiting: nothing is written."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", f"answer-{port}")
    key = exit_together._run_key()
    answer_the_waiting(0, 2, "DistStoreError: wait timeout")
    assert not store.check([f"{key}/count"])
    out = {}
    waiting = threading.Thread(target=lambda: out.setdefault(1, agree_on_error(1, 2, "LOCAL_RANK 'x'", grace_s=120)))
    waiting.start()
    for _ in range(6000):  # rank 1 checked in (a minute at most: a bound on a hang, not a timing)
        if store.check([f"{key}/count"]):
            break
        threading.Event().wait(0.01)
    answer_the_waiting(0, 2, "DistStoreError: wait timeout")
    assert store.add(f"{key}/read", 0) == 2  # rank 1 read before rank 0 went on
    waiting.join(timeout=60)  # well inside rank 1's grace
    assert out == {1: (True, False)}  # rank 1 speaks for itself
    del store


def test_one_process_without_a_store_speaks():
    assert agree_on_error(0, 1, "anything") == (True, True)


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def record(step: int) -> dict:
    return {"step": step, "loss": 0.5, "step_time_s": 0.01, "samples_per_s": 6400.0, "loss_scale": None,
            "skipped": False}


def test_a_terminal_gets_one_live_status_line_with_an_eta():
    out = Tty()
    p = Progress(0, steps=4, batch_size=64, stream=out)
    for s in range(4):
        p.step(record(s))
    p.say("summary: ...")
    text = out.getvalue()
    assert text.count("\r\x1b[K") == 4 and "step 4/4  loss 0.500000  6400.0 samples/s  ETA 0:00:00" in text
    assert text.endswith("\nsummary: ...\n") and text.count("\n") == 2


def test_a_pipe_gets_every_log_every_th_step_line_and_the_last():
    out = io.StringIO()
    p = Progress(0, steps=10, batch_size=64, log_every=4, stream=out)
    for s in range(10):
        p.step(record(s))
    steps = [int(line.split()[1]) for line in out.getvalue().splitlines()]
    assert steps == [3, 7, 9]


def test_other_ranks_and_quiet_print_no_step_lines():
    out = io.StringIO()
    for p in (Progress(1, steps=2, batch_size=8, stream=out), Progress(0, steps=2, batch_size=8, quiet=True,
                                                                       stream=out)):
        p.step(record(0))
        p.say("saved x", verbose=True)
    assert out.getvalue() == ""


class Grid:
    world_size, dp_size, cp_size, pp_size, mp_size = 2, 1, 1, 2, 1


def test_the_summary_names_the_warm_up_steps_it_really_left_out():
    assert "after 2 warm-up steps" in summary_line(Grid, "1f1b", 64, [0.01, 0.01], 2, [0.1, 0.1])
    assert "after 1 warm-up step," in summary_line(Grid, "1f1b", 64, [0.01], 1, [0.1])
    assert "no warm-up steps left out" in summary_line(Grid, "1f1b", 64, [0.01], 0, [0.1])
    assert "no timed steps (all 2 of this run's steps were warm-up)" in summary_line(Grid, "1f1b", 64, [], 2, [])


def run_config(*flags: str):
    return parse_config(list(flags))


def test_output_paths_are_created_or_refused_before_setup(tmp_path):
    check_output_paths(run_config("--metrics", str(tmp_path / "a" / "m.jsonl"), "--trace", str(tmp_path / "b" / "t"),
                                  "--save", str(tmp_path / "c")))
    assert (tmp_path / "a").is_dir() and (tmp_path / "b").is_dir() and (tmp_path / "c").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    for flags, message in ((("--metrics", str(blocker / "m.jsonl")), "--metrics"),
                           (("--trace", str(blocker / "t")), "--trace"),
                           (("--save", str(blocker)), "it is a file"),
                           (("--metrics", str(tmp_path)), "is a directory")):
        with pytest.raises(ConfigError, match=message):
            check_output_paths(run_config(*flags))


def test_the_fault_plan_comes_from_the_test_variables_on_a_first_attempt_only():
    env = {"HYBRID_ENGINE_TEST_KILL_AT_STEP": "3", "HYBRID_ENGINE_TEST_KILL_RANK": "1",
           "HYBRID_ENGINE_TEST_NAN_AT_STEP": "2"}
    plan = FaultPlan.from_test_environ(env)
    assert plan == FaultPlan(kill_at_step=3, kill_rank=1, nan_at_step=2)
    assert plan.kills(3, 1) and not plan.kills(3, 0) and plan.poisons(2) and not plan.crashes_in_save(3, 1)
    assert FaultPlan.from_test_environ(dict(env, TORCHELASTIC_RESTART_COUNT="1")) == FaultPlan()
    assert FaultPlan.from_test_environ({}) == FaultPlan()


def test_run_state_says_where_an_interrupt_found_the_run():
    assert RunState().describe() == "before the first step; last checkpoint none"
    assert RunState(41, "runs/ckpt/step_000040").describe() == "at step 41; last checkpoint runs/ckpt/step_000040"
