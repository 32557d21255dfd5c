"""The loss scaler's skip decision and the global gradient norm across gloo ranks (CPU)."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from dist_utils import run_ranks
from hybrid_engine.optim.scaling import DynamicLossScaler, clip_grad_norm

STEPS = 6
INF_STEP = 2
INF_RANK = 3


def _train_with_injected_inf(rank: int, world_size: int) -> dict:
    """A tiny model per rank, fp16-style scaled backward, inf injected on one rank at one step."""
    model_parallel = dist.new_group(list(range(world_size)))  # the engine's PP x MP group of one replica
    halves = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # two separate groups, to show the scoping
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1, bias=False))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = DynamicLossScaler(init_scale=2.0**10, growth_interval=2)
    half_scaler = DynamicLossScaler(init_scale=2.0**10, growth_interval=2)
    history = {"scale": [], "found_inf": [], "half_found_inf": [], "skipped_unchanged": None, "stepped": [],
               "read_only_found_inf": [], "half_read_only_found_inf": []}

    for step in range(STEPS):
        model.zero_grad(set_to_none=True)
        loss = model(torch.randn(8, 4)).square().mean()
        (loss * scaler.scale).backward()
        if step == INF_STEP and rank == INF_RANK:
            model[0].weight.grad[1, 2] = float("inf")
        grads = [p.grad for p in model.parameters()]
        before = [t.clone() for t in model.state_dict().values()]
        before_opt = [v.clone() for s in optimizer.state.values() for v in s.values()]

        # The read-only check of the fused fp16 step agrees over the group too (a device flag, no unscale).
        history["read_only_found_inf"].append(scaler.find_nonfinite(grads, model_parallel).item() == 1.0)
        found_inf = scaler.unscale_and_check(grads, model_parallel)
        if not found_inf:
            optimizer.step()
        scaler.update(found_inf)

        after = list(model.state_dict().values())
        after_opt = [v for s in optimizer.state.values() for v in s.values()]
        unchanged = all(torch.equal(a, b) for a, b in zip(before + before_opt, after + after_opt))
        if found_inf:
            history["skipped_unchanged"] = unchanged and len(before_opt) == len(after_opt)
        history["stepped"].append(not unchanged)
        history["scale"].append(scaler.scale)
        history["found_inf"].append(found_inf)

        # Same flag, reduced only inside this rank's half: ranks 2 and 3 skip, 0 and 1 do not.
        flag = [torch.zeros(2)]
        if step == INF_STEP and rank == INF_RANK:
            flag[0][0] = float("nan")
        history["half_read_only_found_inf"].append(half_scaler.find_nonfinite(flag, halves[rank // 2]).item() == 1.0)
        history["half_found_inf"].append(half_scaler.unscale_and_check(flag, halves[rank // 2]))
    return history


def test_inf_on_one_rank_makes_every_rank_skip_and_halve_the_scale():
    histories = run_ranks(4, _train_with_injected_inf, timeout=60)
    expected_found = [step == INF_STEP for step in range(STEPS)]
    # growth_interval=2: grow after steps 1, halve at 2, grow after 4
    expected_scale = [2.0**10, 2.0**11, 2.0**10, 2.0**10, 2.0**11, 2.0**11]
    for rank, h in enumerate(histories):
        assert h["found_inf"] == expected_found, f"rank {rank}"
        assert h["read_only_found_inf"] == expected_found, f"rank {rank}"
        assert h["scale"] == expected_scale, f"rank {rank}"
        assert h["skipped_unchanged"] is True, f"rank {rank}: a skipped step changed weights or optimizer state"
        assert h["stepped"] == [not f for f in expected_found], f"rank {rank}: later steps must proceed"
        assert h["half_found_inf"] == [step == INF_STEP and rank >= 2 for step in range(STEPS)], f"rank {rank}"
        assert h["half_read_only_found_inf"] == h["half_found_inf"], f"rank {rank}"


# ---- global-norm clipping over MP x PP ------------------------------------------------------------------
MP, PP = 2, 2


def _full_model_grads() -> list[list[tuple[str, torch.Tensor]]]:
    """Per stage, (kind, full gradient): col = split on dim 0, row = split on dim 1, rep = replicated.
    The same numbers on every rank (seeded), as one process holding the whole model would see them."""
    g = torch.Generator().manual_seed(1234)
    shapes = [
        [("col", (8, 6)), ("col", (8,)), ("row", (5, 8)), ("rep", (5,)), ("rep", (6,))],
        [("col", (4, 5)), ("row", (3, 4)), ("rep", (3,)), ("col16", (6, 3))],
    ]
    return [[(kind, torch.randn(shape, generator=g)) for kind, shape in stage] for stage in shapes]


def _shard(kind: str, full: torch.Tensor, mp_rank: int) -> torch.Tensor:
    if kind == "rep":
        return full.clone()
    if kind == "col16":
        return full.chunk(MP, dim=0)[mp_rank].half().clone()
    return full.chunk(MP, dim=0 if kind == "col" else 1)[mp_rank].clone()


def _clip_on_grid(rank: int, world_size: int, scenario: str) -> dict:
    mp_rank, pp_rank = rank % MP, rank // MP  # rank = mp_rank + MP * pp_rank
    mp_groups = [dist.new_group([pp * MP + m for m in range(MP)]) for pp in range(PP)]
    pp_groups = [dist.new_group([pp * MP + m for pp in range(PP)]) for m in range(MP)]
    stage = _full_model_grads()[pp_rank]
    split = [_shard(kind, full, mp_rank) for kind, full in stage if kind != "rep"]
    replicated = [_shard(kind, full, mp_rank) for kind, full in stage if kind == "rep"]
    if scenario == "inf" and rank == 1:
        split[0][0, 0] = float("inf")
    before = [t.clone() for t in split + replicated]

    reference = math.sqrt(sum(
        full.double().square().sum().item() if kind != "col16" else full.half().double().square().sum().item()
        for stage_grads in _full_model_grads() for kind, full in stage_grads
    ))
    max_norm = {"clip": reference / 3, "noclip": reference * 2, "inf": 1.0}[scenario]
    norm = clip_grad_norm(split, [None] + replicated, max_norm, mp_groups[pp_rank], pp_groups[mp_rank])

    if scenario == "clip":
        coef = max_norm / (reference + 1e-6)
        for got, orig in zip(split + replicated, before):
            tol = 1e-3 if got.dtype == torch.half else 1e-6
            torch.testing.assert_close(got.double(), orig.double() * coef, rtol=tol, atol=tol * 1e-2)
    else:
        assert all(torch.equal(a, b) for a, b in zip(split + replicated, before)), "grads must be untouched"
    return {"norm": norm, "reference": reference}


def test_global_norm_over_mp_and_pp_counts_replicated_once_and_clips():
    for scenario in ("clip", "noclip"):
        results = run_ranks(MP * PP, _clip_on_grid, scenario, timeout=60)
        norms = {r["norm"] for r in results}
        assert len(norms) == 1, f"{scenario}: ranks disagree on the norm: {norms}"
        reference = results[0]["reference"]
        assert abs(norms.pop() - reference) <= 1e-6 * reference


def test_non_finite_norm_on_one_rank_reaches_every_rank_and_clips_nothing():
    results = run_ranks(MP * PP, _clip_on_grid, "inf", timeout=60)
    assert [r["norm"] for r in results] == [float("inf")] * (MP * PP)
