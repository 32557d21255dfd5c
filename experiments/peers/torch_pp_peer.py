"""The GPT over a pipeline of torch.distributed.pipelining, one of its schedules:

  1f1b         Schedule1F1B, one PipelineStage per rank
  interleaved  ScheduleInterleaved1F1B, two stages per rank (stage s on rank s mod pp)
  zbv          ScheduleZBVZeroBubble, two stages per rank in a V (stage s and 2 pp - 1 - s on one rank)
  dualpipev    ScheduleDualPipeV, the same V (it needs at least 2 pp micro-batches)

The cut is the engine's own (gpt_peer_run.engine_cut over the schedule's stage count: at the GPT-1B shape and pp 2
the embeddings and 9 blocks, then 7 blocks and the head), and which rank holds which stage is the engine's
placement (hybrid_engine.parallel.pipeline.schedule.rank_stages), so both pipelines balance the same stages. Each
stage is a slice of the plain GPT (plain_gpt.py) with the engine's initial weights, under bf16 autocast over fp32
weights; the last stage's output goes to the engine's loss (mean cross-entropy in fp32) and the schedule averages
the gradients over the micro-batches itself (scale_grads). compile_blocks compiles each block in place
(torchtitan's per-block torch.compile), not the embeddings or the head: torch refuses a compiled stage module
(OptimizedModule) under its zero-bubble schedules, not blocks compiled in place. AdamW fused, as the engine steps
on CUDA.
"""
from __future__ import annotations

import argparse
import inspect

import torch
import torch._functorch.config
import torch.distributed as dist

from gpt_peer_run import engine_cut
from hybrid_engine.models.gpt.model import GPTConfig, gpt_loss
from hybrid_engine.parallel.pipeline.schedule import rank_stages
from peer_torch_pipelining import Autocast
from plain_gpt import PlainGPT, load_engine_init

SCHEDULES = ("1f1b", "interleaved", "zbv", "dualpipev")
# (torch's class name, stages per rank, the engine's placement of them)
SHAPES = {"1f1b": ("Schedule1F1B", 1, "loop"), "interleaved": ("ScheduleInterleaved1F1B", 2, "loop"),
          "zbv": ("ScheduleZBVZeroBubble", 2, "v"), "dualpipev": ("ScheduleDualPipeV", 2, "v")}


def build(a: argparse.Namespace, cfg: GPTConfig, device: torch.device, compile_blocks: bool,
          schedule_name: str = "1f1b"):
    """(step(inputs, targets) -> loss on every rank, the record's fields) for this rank's stages."""
    import torch.distributed.pipelining as pipelining

    class_name, per_rank, placement = SHAPES[schedule_name]
    rank, pp = dist.get_rank(), dist.get_world_size()
    num_stages = pp * per_rank
    cut = engine_cut(cfg, num_stages)
    mine = rank_stages(rank, pp, num_stages, placement)
    dtype = torch.bfloat16 if a.precision == "bf16" else None
    # The V schedules split a backward into I and W, which runs autograd with retain_graph: a compiled backward that
    # donates its buffers refuses that, and its error names this switch, what a user would turn
    donation_off = compile_blocks and placement == "v"
    if donation_off:
        torch._functorch.config.donated_buffer = False
    stages, params = [], []
    for s in mine:
        block_ids = [i - 1 for i in cut[s] if 1 <= i <= cfg.layers]
        blocks = range(block_ids[0], block_ids[-1] + 1) if block_ids else range(0)
        module = load_engine_init(PlainGPT(cfg, blocks, embed=s == 0, head=s == num_stages - 1).to(device))
        if compile_blocks:
            for block in module.blocks:
                block.compile()
        params += list(module.parameters())
        stages.append(pipelining.PipelineStage(Autocast(module, device.type, dtype), s, num_stages, device))
    schedule_cls = getattr(pipelining.schedules, class_name, None)
    if schedule_cls is None:
        raise SystemExit(f"this torch ({torch.__version__}) has no {class_name}")
    schedule = schedule_cls(stages[0] if per_rank == 1 else stages, a.micro_batches, loss_fn=gpt_loss,
                            scale_grads=True)
    optimizer = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.01, fused=True)
    # nobody needs the merged logits of every micro-batch (2 GB at the GPT-1B shape): don't keep them
    step_kwargs = {"return_outputs": False} if "return_outputs" in inspect.signature(schedule.step).parameters else {}
    first, last = 0 in mine, num_stages - 1 in mine

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        losses: list = []
        kwargs = dict(step_kwargs, **({"target": y, "losses": losses} if last else {}))
        schedule.step(*((x,) if first else ()), **kwargs)
        optimizer.step()
        loss = torch.stack([t.detach().float() for t in losses]).mean() if last else torch.zeros((), device=device)
        dist.all_reduce(loss)  # only the last stage's rank adds its loss
        return loss

    return step, {"system": "torch-pp-compile" if compile_blocks else "torch-pp", "pp": pp, "tp": 1,
                  "schedule": class_name, "stages_per_rank": per_rank,
                  "stage_modules": [f"{lay[0]}..{lay[-1]}" for lay in cut],
                  "compile": ("each block" + (", donated buffers off" if donation_off else "")) if compile_blocks
                  else None,
                  "optimizer": "AdamW (fused)",
                  "init": "the engine's initial weights"}
