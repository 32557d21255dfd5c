#!/usr/bin/env python3
"""hybrid_engine driver: DP x PP x MP training of the course model.

    torchrun --nproc_per_node=8 hybrid_engine.py --dp 2 --pp 2 --mp 2

Reads top to bottom: arguments -> checks (before any collective) -> process groups -> engine -> training
loop -> report. On GPUs it uses CUDA + NCCL, one GPU per process (cuda:LOCAL_RANK); without GPUs, CPU + gloo.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import resource
import statistics
import sys
import threading

import torch
import torch.distributed as dist

from hybrid_engine import checkpoint, faults, losses, optim
from hybrid_engine.config import SCHEDULES, ConfigError, LaunchEnv, check_training, resolve_grid
from hybrid_engine.engine import Engine
from hybrid_engine.exit_together import wait_for_all_ranks
from hybrid_engine.grid import build_groups, grid_picture, host_name, mapping_table
from hybrid_engine.models import SyntheticRegression, large_linear_model
from hybrid_engine.engine_config import (AMP_IMPLS as IMPLEMENTATIONS, DataParallelConfig, PrecisionConfig,
                                         ScheduleConfig, StageConfig)
from hybrid_engine.trace import gather_pipeline_rows, spans_of, write_trace


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (every rank prints the same) and exit code 2."""

    def error(self, message: str):  # noqa: D102
        raise ConfigError(message)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _OneLineParser(
        description="Hybrid data x pipeline x tensor parallel training of the course MLP "
        "(depth x [Linear(dim, dim) + ReLU], MSE against a fixed random teacher).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("grid")
    g.add_argument("--dp", type=int, default=None, help="data-parallel replicas (default: world / (pp * mp))")
    g.add_argument("--pp", type=int, default=1, help="pipeline-parallel stages (ranks per pipeline)")
    g.add_argument("--mp", type=int, default=1, help="tensor (model) parallel ranks per layer")
    g.add_argument("--order", default="mp-dp-pp",
                   help="rank layout, axes from fastest- to slowest-varying; the default keeps MP peers adjacent")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA + NCCL when GPUs exist, else CPU + gloo")
    g.add_argument("--memory-cap-gib", type=float, default=None,
                   help="CUDA: let this process allocate at most this much GPU memory (a smaller card's limit)")
    g.add_argument("--comm-timeout", type=float, default=60.0,
                   help="seconds a collective may wait for a peer before this rank gives up")
    g.add_argument("--dp-grad-dtype", choices=("fp32", "bf16"), default="fp32",
                   help="dtype of the gradients on the wire in the DP all-reduce: bf16 halves the bytes, rounding "
                        "each replica's gradient and their sum to bf16 (accumulation stays fp32)")

    g.add_argument("--zero", type=int, choices=(0, 1), default=0,
                   help="1: the distributed optimizer (ZeRO-1): optimizer state and fp32 masters sharded over DP, "
                        "gradient buckets reduce-scattered, updated weights all-gathered")

    s = p.add_argument_group("pipeline schedule")
    s.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="pipeline schedule")
    s.add_argument("--virtual-stages", type=int, default=1, help="model chunks per rank (interleaved only)")
    s.add_argument("--lookahead", type=int, default=0,
                   help="1f1b/zb1: forwards every rank but the last runs beyond the 1F1B warm-up; hides the "
                        "gradient's round trip at the cost of one more micro-batch of activations per step")
    s.add_argument("--no-fuse", action="store_true",
                   help="run stages module by module instead of as one C++ Linear(+ReLU) chain (for comparison)")
    s.add_argument("--autograd-stages", action="store_true",
                   help="run fused chains as autograd nodes called through Python instead of natively in the "
                        "executor (for comparison)")
    s.add_argument("--recompute", action="store_true",
                   help="activation recomputation: keep only stage inputs between forward and backward")
    s.add_argument("--merge-wgrad", action="store_true",
                   help="zb1: compute each stage's weight gradients once over all micro-batches (one GEMM)")

    m = p.add_argument_group("model and data")
    m.add_argument("--dim", type=int, default=1024, help="hidden size of every Linear layer")
    m.add_argument("--depth", type=int, default=8, help="number of Linear + ReLU blocks")
    m.add_argument("--batch-size", type=int, default=64, help="global batch size (all DP replicas together)")
    m.add_argument("--micro-batches", type=int, default=4, help="micro-batches per DP rank per step")
    m.add_argument("--seed", type=int, default=0, help="initial weights and data depend on this alone")
    m.add_argument("--stream-data", action="store_true",
                   help="draw each micro-batch when its forward runs instead of the whole batch before the step: "
                        "the batch is never resident (a larger largest batch), for a few kernels per micro-batch")

    t = p.add_argument_group("training")
    t.add_argument("--steps", type=int, default=10, help="optimizer steps (0: set up, print the grid, stop)")
    t.add_argument("--warmup", type=int, default=2, help="steps left out of the timing summary")
    t.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    t.add_argument("--lr", type=float, default=1e-2, help="learning rate")

    a = p.add_argument_group("mixed precision")
    a.add_argument("--amp", choices=("off", "fp16", "bf16"), default="off",
                   help="half-precision compute: fp16 (with dynamic loss scaling) or bf16 (no scaling)")
    a.add_argument("--amp-impl", choices=IMPLEMENTATIONS, default="half-weights",
                   help="autocast: fp32 weights cast per matrix product; half-weights: half weights for the whole "
                        "step with fp32 master weights and fp32 gradient accumulation")
    a.add_argument("--loss-scale", type=float, default=None, help="fp16: a static loss scale instead of dynamic")
    a.add_argument("--scale-window", type=int, default=2000, help="fp16: clean steps before the scale doubles")
    a.add_argument("--hysteresis", type=int, default=1, help="fp16: overflows tolerated before the scale halves")
    a.add_argument("--clip-grad", type=float, default=0.0, help="clip the global gradient norm to this (0: off)")

    r = p.add_argument_group("reporting")
    r.add_argument("--metrics", default=None, help="write one JSON line per step here (rank 0)")
    r.add_argument("--quiet", action="store_true", help="no per-step lines, only the summary")
    r.add_argument("--trace", default=None, metavar="PATH",
                   help="time every action of the last step; rank 0 writes PATH.json (Chrome trace), PATH.png and "
                        "PATH.simulated.png, and reports the measured bubble")

    c = p.add_argument_group("checkpoints (see hybrid_engine/checkpoint.py and README.md, Failure behaviour)")
    c.add_argument("--save", metavar="DIR", default=None,
                   help="write checkpoints under DIR (DIR/step_N, DIR/latest); must be visible to every rank")
    c.add_argument("--save-every", metavar="N", type=int, default=0,
                   help="also save after every N steps (0: only after the last step)")
    c.add_argument("--keep-checkpoints", metavar="K", type=int, default=3, help="keep the newest K checkpoints")
    c.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --save DIR if there is one, else start as usual "
                        "(from --load, or from scratch): what a restarted job (torchrun --max-restarts) needs")
    c.add_argument("--load", metavar="PATH", default=None,
                   help="start from this checkpoint (DIR/step_N, or a --save DIR: its latest), on any grid; "
                        "--steps counts from step 0, so training continues at the checkpoint's step")
    return p.parse_args(argv)


class TrainingStopped(Exception):
    """Training cannot go on (a non-finite loss); every rank finds it at the same step (the loss is all-reduced)."""


def model_info(args: argparse.Namespace) -> tuple[dict, dict[str, tuple[int, ...]]]:
    """What a checkpoint must match: the model config and every parameter's full shape (a meta model: free)."""
    shapes = {k: tuple(v.shape) for k, v in large_linear_model(args.dim, args.depth, args.seed).state_dict().items()}
    return {"name": "large_linear_model", "dim": args.dim, "depth": args.depth, "seed": args.seed}, shapes


def checkpoint_to_start_from(args: argparse.Namespace) -> checkpoint.Checkpoint | None:
    """The checkpoint this run continues (None: from scratch), checked on every rank before any collective."""
    if args.save_every < 0 or args.keep_checkpoints < 1:
        raise ConfigError(f"--save-every must be >= 0 and --keep-checkpoints >= 1, got {args.save_every} and "
                          f"{args.keep_checkpoints}")
    if (args.resume or args.save_every) and not args.save:
        raise ConfigError("--resume and --save-every need --save DIR (to continue from a checkpoint elsewhere, "
                          "use --load PATH)")
    existing = None
    if args.save:
        try:
            os.makedirs(args.save, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--save {args.save}: cannot create the directory ({exc.strerror})") from None
        checkpoint.hold_directory(args.save)  # rank 0 holds DIR/.lock for the run; agreed on after init
        existing = checkpoint.latest_path(args.save)
        if existing and not args.resume:
            raise ConfigError(f"--save {args.save} already holds checkpoints (latest {existing}); pass --resume "
                              "to continue from it, or choose another directory")
    path = existing if (args.resume and existing) else args.load
    if path is None:
        return None
    ckpt = checkpoint.open_checkpoint(path)
    model, shapes = model_info(args)
    checkpoint.check_compatible(ckpt, model, shapes, args.optimizer)
    return ckpt


def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda but no CUDA GPU is visible")
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs are visible")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(env: LaunchEnv, device: torch.device, timeout_s: float) -> None:
    if env.world_size == 1 and "MASTER_ADDR" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
    backend = "nccl" if device.type == "cuda" else "gloo"
    # reached (or served, by rank 0 without torchrun) within timeout_s, or one line: a plain TCPStore client waits
    # forever on a MASTER_PORT that another program holds
    store = faults.rendezvous_store(env.rank, env.world_size, timeout_s)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is not None and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's agent keeps one store across --max-restarts attempts: without a prefix per attempt, a restarted
        # run finds the dead attempt's gloo/NCCL addresses under the same keys and fails connecting to them.
        store = dist.PrefixStore(f"hybrid_engine/attempt_{attempt}/", store)
    dist.init_process_group(
        backend,
        store=store,
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def gather_floats(value: float, device: torch.device) -> list[float]:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [round(float(x.item()), 3) for x in out]


def micro_batch_sources(data: SyntheticRegression, step: int, first_row: int, rows: int, engine: Engine,
                        dtype: torch.dtype, poison: bool):
    """(inputs, targets) for --stream-data: callables micro -> that micro-batch's rows of this DP rank, drawn
    when the engine's forward asks (the same values as slicing the whole draw), or None where the rank
    consumes none. `poison` fills the inputs with NaN (the NAN_AT_STEP fault hook)."""
    def rows_of(micro: int) -> tuple[int, int]:
        return first_row + micro * rows, first_row + (micro + 1) * rows

    def inputs(micro: int) -> torch.Tensor:
        x = data.draw(step, *rows_of(micro), targets=False, dtype=dtype)[0]
        return x.fill_(float("nan")) if poison else x

    def targets(micro: int) -> torch.Tensor:
        return data.draw(step, *rows_of(micro), inputs=False, dtype=dtype)[1]

    return (inputs if engine.holds_first_stage else None), (targets if engine.holds_last_stage else None)


def main(argv: list[str] | None = None, heartbeat: faults.Heartbeat | None = None) -> int:
    args = parse_args(argv)
    env = LaunchEnv.from_environ()
    grid = resolve_grid(args.dp, args.pp, args.mp, args.order, env.world_size)
    device = pick_device(args.device, env.local_rank)
    check_training(grid, schedule=args.schedule, virtual_stages=args.virtual_stages, depth=args.depth,
                   dim=args.dim, batch_size=args.batch_size, micro_batches=args.micro_batches,
                   amp=args.amp, device_type=device.type, lookahead=args.lookahead)
    if args.loss_scale is not None and args.amp != "fp16":
        raise ConfigError(f"--loss-scale applies to --amp fp16 only, got --amp {args.amp}")
    start_from = checkpoint_to_start_from(args)

    if args.memory_cap_gib is not None and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_cap_gib * 2**30 / total), device)
    init_distributed(env, device, args.comm_timeout)
    if heartbeat is not None:
        heartbeat.start(args.comm_timeout)  # lets the others name this rank if it is lost (hybrid_engine/faults.py)
    checkpoint.agree_on_directory_holds()  # --save DIR in use by another run: every rank stops here, exit 2
    groups = build_groups(grid, env.rank, timeout_s=args.comm_timeout)
    places = [None] * env.world_size
    dist.all_gather_object(places, (host_name(), str(device)))
    if env.rank == 0:
        print(mapping_table(grid, [h for h, _ in places], [d for _, d in places]))
        print(grid_picture(grid), flush=True)

    model = large_linear_model(args.dim, args.depth, args.seed)  # meta: each rank builds only its stages
    engine = Engine(
        model, losses.MSE(), groups, optimizer=optim.from_name(args.optimizer, args.lr),
        schedule=ScheduleConfig(args.schedule, args.micro_batches, args.virtual_stages, args.lookahead,
                                args.merge_wgrad),
        stages=StageConfig("autograd" if args.no_fuse or args.autograd_stages else "auto", args.recompute),
        precision=PrecisionConfig(args.amp, args.amp_impl, args.loss_scale, args.scale_window, args.hysteresis,
                                  args.clip_grad),
        data_parallel=DataParallelConfig(grad_dtype=args.dp_grad_dtype, zero=args.zero), device=device,
        trace=args.trace is not None)
    data = SyntheticRegression(args.dim, args.seed, device)
    per_dp = args.batch_size // grid.dp_size
    dp_rank = groups.coords.dp
    needs_data = engine.holds_first_stage or engine.holds_last_stage  # a middle stage draws nothing
    data_dtype = engine.precision.half_dtype if engine.precision.half_weights else torch.float32
    first_step = checkpoint.load(engine, start_from) if start_from else 0
    if start_from and env.rank == 0:
        print(f"resumed from {start_from.path} at step {first_step}", flush=True)

    # a resumed run appends: the file then holds the whole history (replayed steps appear twice, the last wins)
    metrics = open(args.metrics, "a" if start_from else "w") if (args.metrics and env.rank == 0) else None
    times: list[float] = []
    peaks: list[float] = []
    for step in range(first_step, args.steps):
        if faults.hook_fires("KILL_AT_STEP", step, env.rank):
            faults.kill_self()
        # Only this DP rank's rows, and only what this rank consumes: inputs on the first stage, targets on the
        # last (drawn block by block: no full-size inputs kept for them), straight in the dtype the engine
        # takes (half weights take half data), so no full-size fp32 copy ever exists. Data, not the engine,
        # would otherwise set the largest batch (experiments/max_batch.py).
        poison = faults.hook_fires("NAN_AT_STEP", step)
        if args.stream_data:
            x, y = micro_batch_sources(data, step, dp_rank * per_dp, per_dp // args.micro_batches, engine,
                                       data_dtype, poison)
        else:
            x, y = data.draw(step, dp_rank * per_dp, (dp_rank + 1) * per_dp, inputs=engine.holds_first_stage,
                             targets=engine.holds_last_stage, dtype=data_dtype) if needs_data else (None, None)
            if poison and x is not None:
                x.fill_(float("nan"))  # this step's own tensor: no copy
        result = engine.train_step(x, y)
        x = y = None  # the step's data dies here, before anything else (a checkpoint, the next step's draw)
        if not math.isfinite(result.loss):  # the same all-reduced value on every rank: all stop here together
            raise TrainingStopped(f"loss is {'NaN' if math.isnan(result.loss) else result.loss} at step {step}: "
                                  "training stopped (lower --lr; with --save, --resume continues from the last "
                                  "checkpoint, written before this step)")
        peaks = gather_floats(peak_memory_gib(device), device)
        if step >= args.warmup:
            times.append(result.step_time_s)
        record = {"step": step, "loss": result.loss, "step_time_s": round(result.step_time_s, 6),
                  "samples_per_s": round(args.batch_size / result.step_time_s, 1), "peak_mem_gib": peaks,
                  "loss_scale": result.loss_scale, "skipped": result.skipped, "grad_norm": result.grad_norm}
        if env.rank == 0:
            if metrics:
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
            if not args.quiet:
                extra = f"  scale {result.loss_scale:g}{' SKIPPED' if result.skipped else ''}" if result.loss_scale else ""
                print(f"step {step:4d}  loss {result.loss:.6f}  {result.step_time_s * 1e3:8.2f} ms  "
                      f"{record['samples_per_s']:10.1f} samples/s{extra}", flush=True)
        if args.save and (step + 1 == args.steps or (args.save_every and (step + 1) % args.save_every == 0)):
            model, _ = model_info(args)
            path = checkpoint.save(engine, args.save, step + 1, {"model": model, "optimizer": args.optimizer},
                                   keep=args.keep_checkpoints,
                                   crash_in_save=faults.hook_fires("CRASH_IN_SAVE", step + 1, env.rank))
            if env.rank == 0 and not args.quiet:
                print(f"saved {path}", flush=True)

    if start_from and first_step >= args.steps and env.rank == 0:
        print(f"nothing to do: the checkpoint is at step {first_step}, --steps is {args.steps}", flush=True)
    if env.rank == 0 and times:
        median = statistics.median(times)
        print(f"summary: {grid.world_size} ranks ({grid.dp_size} dp x {grid.pp_size} pp x {grid.mp_size} mp), "
              f"schedule {args.schedule}, median step {median * 1e3:.2f} ms after {args.warmup} warm-up steps, "
              f"{args.batch_size / median:.1f} samples/s, peak memory per rank (GiB) {peaks}", flush=True)
    if args.trace and args.steps > 0:
        c = groups.coords
        rows = gather_pipeline_rows(spans_of(engine.trace), c.pp, grid.pp_size, c.dp == 0 and c.mp == 0)
        if env.rank == 0:
            summary = write_trace(args.trace, rows, args.schedule, args.micro_batches, args.virtual_stages,
                                  args.lookahead)
            print(f"trace: {args.trace}.json, measured bubble {summary['measured_bubble']:.3f}, "
                  f"simulated {summary['simulated_bubble']:.3f} (unit costs), "
                  f"{summary['calibrated_bubble']:.3f} (this run's per-stage action times)", flush=True)
            if metrics:
                metrics.write(json.dumps({"trace": summary}) + "\n")
    if metrics:
        metrics.close()
    engine.close()  # the executor holds process groups: release them before the groups are destroyed
    dist.destroy_process_group()
    return 0


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default  # LaunchEnv reports the bad value


def run() -> int:
    """Every failure becomes one line on this rank's stderr and a non-zero exit; --debug-style tracebacks
    are available with HYBRID_ENGINE_DEBUG=1. Exit codes: 0 done, 2 bad input (flags, grid, checkpoint),
    1 training stopped (NaN loss) or a failure (a lost peer: the line names it), 143 stopped by SIGTERM."""
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    heartbeat = faults.Heartbeat(rank, world)
    reporter = faults.SigtermReporter(rank, heartbeat).install()

    def leave(code: int, line, wait_for_peers: bool) -> int:  # line: str, or a function that makes it
        if not reporter.leaving(code):
            threading.Event().wait()  # the SIGTERM thread is reporting and ends the process
        heartbeat.note_exit()
        faults.say(line() if callable(line) else line)
        reporter.reported()
        if wait_for_peers:
            heartbeat.stop()
            wait_for_all_ranks(rank, world)
        return code

    try:
        code = main(heartbeat=heartbeat)
        reporter.leaving(code)
        heartbeat.note_exit()
        return code
    except ConfigError as exc:
        return leave(2, f"hybrid_engine: error: {exc}", wait_for_peers=True)
    except TrainingStopped as exc:
        return leave(1, f"hybrid_engine: error: {exc}", wait_for_peers=True)
    except faults.RendezvousError as exc:  # no store: no peer to name or to wait for
        return leave(1, f"hybrid_engine: rank {rank}: {exc}", wait_for_peers=False)
    except Exception as exc:  # noqa: BLE001 - the driver's job is to turn any failure into one clear line
        if os.environ.get("HYBRID_ENGINE_DEBUG"):
            heartbeat.stop()
            raise
        # gloo prefixes "[.../pair.cc:537] " and appends advice; the first sentence is what a user needs
        first = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).splitlines()[0] if str(exc) else "")
        what = f"{type(exc).__name__}: {first.split('. ')[0]}"

        def line() -> str:  # a lost peer is the usual cause: watch the heartbeats a moment to name it
            lost = heartbeat.describe_loss()
            return f"hybrid_engine: rank {rank}: {lost + '; ' if lost else ''}{what}"

        code = leave(1, line, wait_for_peers=False)
        if world > 1:  # peers are gone or going: skip process-group teardown, which could wait on them
            heartbeat.linger()
            sys.stdout.flush()
            os._exit(code)
        return code
    finally:
        heartbeat.stop()  # a heartbeat thread still inside a store call at interpreter exit aborts the process


if __name__ == "__main__":
    sys.exit(run())
