"""When a step hangs, say where. The executor's activity record becomes stage, action, peer and collective (in
one process); and end to end, a rank frozen mid-step (test hook FREEZE_AT_STEP, SIGSTOP) leaves each survivor stuck
in a pipeline receive, whose line names the stage, the receive, the peer and the channel, and rank 0 lines the
waits up into the chain that ends at the frozen rank."""
import os
import subprocess
import sys

from launch_utils import DRIVER, REPO, free_port

from hybrid_engine.runtime.hang_report import Placement, describe

# rank 5 of dp2 x pp2 x mp2 (order mp-dp-pp): pipeline [1, 5], DP [5, 7], MP [4, 5]
HERE = Placement(rank=5, pp_ranks=(1, 5), dp_ranks=(5, 7), mp_ranks=(4, 5), hosts=("a",) * 4 + ("b",) * 4)


def _activity(**fields) -> dict:
    record = {"in_step": True, "action": None, "stage": None, "wait": "none", "awaited": None, "peer_pp_rank": -1,
              "steps_started": 3}
    record.update(fields)
    return record


def test_a_receive_names_stage_action_peer_and_channel():
    long, short = describe(_activity(action="1B3", stage=1, wait="recv", awaited="1RECV_F3", peer_pp_rank=0), HERE)
    assert long == ("stalled at stage 1, action 1RECV_F3 (needed by 1B3), peer rank 1 (host a), collective recv on the pp "
                    "activation channel 0->1")
    assert short == "1RECV_F3 <- rank 1"


def test_a_send_the_dp_sync_and_a_compute_action_name_their_collective():
    long, short = describe(_activity(action="1SEND_B2", stage=1, wait="send", awaited="1SEND_B2", peer_pp_rank=0),
                           HERE)
    assert long.endswith("peer rank 1 (host a), collective send on the pp gradient channel 1->0")
    assert short == "1SEND_B2 -> rank 1"
    long, short = describe(_activity(wait="dp_sync"), HERE)
    assert long == ("stalled at the end of the pipeline step, collective DP gradient all-reduce / reduce-scatter of ranks 5, 7 "
                    "(host b)")
    long, short = describe(_activity(action="1F0", stage=1), HERE)
    assert long == "in stage 1, action 1F0, collective the stage's MP collectives of ranks 4, 5 (host b)"
    assert describe(_activity(in_step=False), HERE) is None and describe(None, HERE) is None


def test_a_rank_frozen_mid_step_leaves_the_others_naming_where_they_wait():
    # pp 3 without a launcher: rank 2 stops as step 2 begins; rank 1 then waits for its gradient (1RECV_B0),
    # rank 0 for rank 1's (0RECV_B0). The timeout only catches a hang: --comm-timeout 5 plus a loaded machine.
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", CUDA_VISIBLE_DEVICES="",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="3",
               HYBRID_ENGINE_TEST_FREEZE_AT_STEP="2", HYBRID_ENGINE_TEST_KILL_RANK="2")
    args = ("--pp", "3", "--dim", "32", "--depth", "3", "--batch-size", "8", "--micro-batches", "2",
            "--steps", "100", "--comm-timeout", "5")
    procs = [subprocess.Popen([sys.executable, str(DRIVER), *args], cwd=REPO, text=True,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r), HYBRID_ENGINE_HOST=f"h{r}"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(3)]
    try:
        errs = [p.communicate(timeout=90)[1] for p in procs[:2]]
        procs[2].wait(timeout=10)  # ended by a survivor, which found it stopped
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [1, 1, -9], errs
    lines = [[ln for ln in err.splitlines() if ln.startswith("hybrid_engine:")] for err in errs]
    assert "stalled at stage 1, action 1RECV_B0 (needed by 1B0), peer rank 2 (host h2), collective recv on the pp " \
           "gradient channel 2->1; RuntimeError: Timed out" in lines[1][0], errs[1]
    assert len(lines[1]) == 1 and lines[1][0].startswith("hybrid_engine: rank 1: lost rank 2 "), errs[1]
    assert "stalled at stage 0, action 0RECV_B0 (needed by 0B0), peer rank 1 (host h1), collective recv on the pp " \
           "gradient channel 1->0; RuntimeError: Timed out" in lines[0][0], errs[0]
    assert lines[0][1:] == ["hybrid_engine: where the ranks waited: rank 0 0RECV_B0 <- rank 1 | "
                            "rank 1 1RECV_B0 <- rank 2 | rank 2 lost"], errs[0]
