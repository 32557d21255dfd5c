"""Context-parallel attention against one process's causal SDPA (fp32, gloo): the ring and the all-gather, cp 2 and
4, every block kernel the CPU has, grouped-query attention (only kv heads travel): the outputs and the gradients of
q, k and v match to 1e-5; a later token changed changes no earlier token's output, across chunk boundaries; the
split refuses a sequence it cannot cut evenly. One launch per cp size runs every case."""
from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import hybrid_engine._C as _C
from dist_utils import run_ranks
from hybrid_engine.parallel.context import ContextParallel, check_sequence, local_chunks, positions
from hybrid_engine.parallel.context.all_gather import AllGatherAttention
from hybrid_engine.parallel.context.ring import RingAttention
from hybrid_engine.planner.card import CARDS
from hybrid_engine.planner.context_comm import comm_rule

B, HEADS, KV_HEADS, D, SEQ = 2, 4, 2, 8, 48


def _full(seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, SEQ, D, generator=g, dtype=torch.float64).float() for h in (HEADS, KV_HEADS, KV_HEADS)]


def reference(q, k, v):
    """Dense causal attention, its output and the gradients of sum(out * weight)."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    weight = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out * weight).sum().backward()
    return out.detach(), weight, q.grad, k.grad, v.grad


def cases(rank: int, world: int) -> list[dict]:
    group = dist.new_group(list(range(world)))
    trace = _C.CommTrace("cpu")
    ctx = ContextParallel.of_group(group, list(range(world)), comm_rule("auto", CARDS["cpu"]), trace=trace)
    out = []
    q, k, v = _full(1)
    _, weight, *_ = reference(q, k, v)
    for fn in (RingAttention, AllGatherAttention):
        for backend in ("cpu-flash", "math"):
            mine = [local_chunks(t, rank, world, dim=2).clone().requires_grad_() for t in (q, k, v)]
            y = fn.apply(*mine, ctx.comm, D ** -0.5, backend)
            (y * local_chunks(weight, rank, world, dim=2)).sum().backward()
            out.append({"fn": fn.__name__, "backend": backend, "out": y.detach().numpy(),
                        "grads": [t.grad.numpy() for t in mine]})
    # causality: change the last chunk's tokens (and one token inside chunk 1): no earlier output moves
    later = [t.clone() for t in (q, k, v)]
    for t in later:
        t[:, :, SEQ // 2 + 3:] += 1.0
    for name in ("ring", "all-gather"):
        forced = ContextParallel(ctx.comm, comm_rule(name, CARDS["cpu"]))
        before = forced.attention(*(local_chunks(t, rank, world, dim=2) for t in (q, k, v)))
        after = forced.attention(*(local_chunks(t, rank, world, dim=2) for t in later))
        assert forced.choice(*(local_chunks(t, rank, world, dim=2) for t in (q, k))) == (name, "cpu-flash")
        out.append({"causal": name, "before": before.numpy(), "after": after.numpy()})  # tensors would travel as fds
    out.append({"spans": [(s.axis, s.kind) for s in trace.take()]})
    dist.barrier()
    return out


def test_ring_and_all_gather_match_one_process_and_are_causal():
    q, k, v = _full(1)
    ref_out, _, *ref_grads = reference(q, k, v)
    for world in (2, 4):
        results = run_ranks(world, cases, timeout=120)
        checked = 0
        for rank, per_rank in enumerate(results):
            where = positions(SEQ, rank, world)
            for case in per_rank:
                if "fn" in case:
                    case = {**case, "out": torch.from_numpy(case["out"]),
                            "grads": [torch.from_numpy(g) for g in case["grads"]]}
                    assert torch.allclose(case["out"], ref_out[:, :, where], atol=1e-5), (world, rank, case["fn"])
                    for got, want in zip(case["grads"], ref_grads):
                        assert torch.allclose(got, want[:, :, where], atol=1e-5), (world, rank, case["fn"],
                                                                                   case["backend"])
                    checked += 1
                elif "causal" in case:
                    earlier = where < SEQ // 2 + 3
                    case = {k: torch.from_numpy(v) if k != "causal" else v for k, v in case.items()}
                    assert torch.equal(case["before"][:, :, earlier], case["after"][:, :, earlier]), case["causal"]
                    assert not torch.allclose(case["before"][:, :, ~earlier], case["after"][:, :, ~earlier])
                else:  # the trace saw both kinds of transfer: the ring's hops and the gather's collectives
                    kinds = set(case["spans"])
                    assert kinds == {("cp", "send_recv"), ("cp", "all_gather"), ("cp", "all_reduce")}, kinds
                    # the ring: cp - 1 K/V hops forward, as many backward and cp dK/dV hops, per call
                    hops = sum(k == ("cp", "send_recv") for k in case["spans"])
                    assert hops == 2 * (3 * world - 2) + 2 * (world - 1), hops  # and 2 forwards in the causal check
        assert checked == world * 4


def test_a_rank_draws_its_chunks_of_each_row_only():
    from hybrid_engine.data import MarkovChain, TokenDataset

    data = TokenDataset(MarkovChain(5, vocab=50).sample(4096, 7), 50, 24, seed=11)
    x, y = data.draw(3, 2, 6)
    for rank in range(3):
        mine = data.draw(3, 2, 6, chunks=(rank, 3))
        assert torch.equal(mine[0], local_chunks(x, rank, 3)) and torch.equal(mine[1], local_chunks(y, rank, 3))
        assert torch.equal(data.val_batch(1, 8, 0, 4, chunks=(rank, 3))[1], local_chunks(data.val_batch(1, 8, 0, 4)[1],
                                                                                          rank, 3))


def test_the_split_is_head_tail_and_refuses_uneven_sequences():
    assert positions(16, 0, 2).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert positions(16, 1, 2).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    everything = torch.cat([positions(24, r, 3) for r in range(3)])
    assert sorted(everything.tolist()) == list(range(24))
    assert check_sequence(20, 4) == ("--seq-len 20 is not divisible by 2 x --cp = 8: context parallelism cuts each "
                                     "sequence into 2 x cp equal chunks (rank r holds chunk r and chunk 2 cp - 1 - r)")
    assert check_sequence(24, 3) is None and check_sequence(7, 1) is None


def test_a_split_that_cannot_be_cut_is_one_line_and_exit_2_before_any_collective():
    from hybrid_engine.config.engine import ConfigError
    from hybrid_engine.models import registry
    from hybrid_engine.train.cli import parse_config
    from launch_utils import torchrun

    done = torchrun(2, "--model", "llama", "--cp", "2", "--seq-len", "30", timeout=50)  # inside --comm-timeout
    assert "exitcode  : 2" in done.stderr, done.stderr  # torchrun's report of the first rank to leave
    assert [line for line in done.stderr.splitlines() if line.startswith("hybrid_engine")] == [
        "hybrid_engine: error: --seq-len 30 is not divisible by 2 x --cp = 4: context parallelism cuts each "
        "sequence into 2 x cp equal chunks (rank r holds chunk r and chunk 2 cp - 1 - r)"]
    assert "hybrid_engine" not in "".join(re.findall(r'File "[^"]*"', done.stderr))  # no traceback of ours
    for flags, message in (
            (["--model", "mlp", "--cp", "2"], "--cp 2 splits sequences: it applies to the token models (gpt, llama) "
                                              "only"),
            (["--model", "gpt", "--cp", "2", "--mp", "4", "--dp", "1", "--seq-len", "12", "--sequence-parallel"],
             "--sequence-parallel with --cp 2: the 6 tokens per cp rank are not divisible by --mp 4"),
            (["--model", "gpt", "--cp", "0"], "--cp must be >= 1, got 0")):
        try:
            parse_config(flags).validate(8 if "--mp" in flags else 4, "cpu", registry.check_model)
        except ConfigError as exc:
            assert str(exc) == message, flags
        else:
            raise AssertionError(f"{flags} accepted")


def test_auto_takes_the_ring_for_long_shares_on_more_than_two_ranks():
    """The planner's rule (planner/context_comm.py; its crossover from the arithmetic in tests/planner/
    test_context_comm.py) on a rank's tensors: a Llama-1B-class layer on an H100 (32 heads of 64, 8 kv heads)."""
    def choose(asked: str, tokens: int, cp: int):
        q = torch.empty(1, 32, tokens, 64, dtype=torch.bfloat16, device="meta")
        k = torch.empty(1, 8, tokens, 64, dtype=torch.bfloat16, device="meta")
        chosen = comm_rule(asked, CARDS["h100"])(q, k, cp, "cudnn")
        return chosen.name, chosen.why

    name, why = choose("auto", 8192, 4)
    assert name == "ring" and why.startswith("auto: K/V traffic exposes ") and "against the all-gather's" in why
    assert choose("auto", 4096, 8)[0] == "ring"
    assert choose("auto", 64, 8)[0] == choose("auto", 64, 4)[0] == "all-gather"  # a share far too short to hide a hop
    assert choose("ring", 16, 2) == ("ring", "--cp-comm") and choose("all-gather", 10**6, 8)[0] == "all-gather"


@pytest.mark.parametrize("backend", ["cudnn", "flash"])
def test_the_cuda_kernels_calls_take_their_arguments(backend):
    """The CUDA backends' aten calls, on the meta device (their shape functions: no GPU here): the forward's
    log-sum-exp per row, and a backward given the merged rows of a smaller key block and grouped kv heads."""
    from hybrid_engine.parallel.context.block_attention import block_backward, block_forward

    q = torch.empty(2, 8, 64, 16, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 2, 32, 16, device="meta", dtype=torch.bfloat16)
    out, lse = block_forward(q, k, k, False, 0.25, backend)
    assert out.shape == q.shape and lse.shape == (2, 8, 64) and lse.dtype == torch.float32
    dq, dk, dv = block_backward(q[:, :, 32:], q[:, :, 32:], k, k, out[:, :, 32:], lse[:, :, 32:], False, 0.25,
                                backend)
    assert dq.shape == (2, 8, 32, 16) and dk.shape == dv.shape == k.shape


def test_the_blocks_kernel_is_the_devices_and_a_cuda_choice_is_refused_on_the_cpu():
    from hybrid_engine.config.engine import ConfigError
    from hybrid_engine.models import registry
    from hybrid_engine.parallel.context.block_attention import pick_backend
    from hybrid_engine.train.cli import parse_config

    q, k = torch.zeros(1, 4, 8, 16, dtype=torch.bfloat16), torch.zeros(1, 2, 8, 16, dtype=torch.bfloat16)
    assert pick_backend(q, k) == pick_backend(q, k, "cudnn") == ("cpu-flash", "the CPU's")
    flags = ["--model", "llama", "--cp", "2", "--seq-len", "16", "--cp-kernel", "cudnn"]
    with pytest.raises(ConfigError) as refused:
        parse_config(flags).validate(2, "cpu", registry.check_model)
    assert str(refused.value) == ("--cp-kernel cudnn chooses between CUDA kernels; on the CPU the blocks run aten's "
                                  "flash-for-CPU kernel (leave it auto)")
    parse_config(flags).validate(2, "cuda", registry.check_model)
