"""The command line: flags (and `--config run.toml`) -> RunConfig -> checks -> process groups -> Trainer.

    torchrun --nproc_per_node=8 hybrid_engine.py --dp 2 --pp 2 --mp 2
    python -m hybrid_engine ... | hybrid-engine ...                    (the same CLI)

Reads top to bottom: `run` turns every failure into one line and an exit code; `main` parses, checks everything
that needs no process group, then sets up the grid and trains. On GPUs it uses CUDA + NCCL, one GPU per process
(cuda:LOCAL_RANK); without GPUs, CPU + gloo.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import re
import shlex
import sys
import threading
import time
from typing import NoReturn

import torch
import torch.distributed as dist

from hybrid_engine import checkpoint
from hybrid_engine.runtime import comm_check, entry, faults, hang_report, slurm
from hybrid_engine.config.run import ConfigError, LaunchEnv, RunConfig
from hybrid_engine.runtime.exit_together import agree_on_error, answer_the_waiting
from hybrid_engine.runtime.fault_plan import FaultPlan
from hybrid_engine.config import flags
from hybrid_engine.models import registry
from hybrid_engine.parallel.grid import GridGroups, build_groups, grid_picture, mapping_table
from hybrid_engine.parallel.nodes import NodeMap, check_mp_within_nodes, host_name
from hybrid_engine.runtime.interrupts import InterruptReporter
from hybrid_engine.checkpoint.runs import checkpoint_to_start_from
from hybrid_engine.config.output_paths import check_output_paths
from hybrid_engine.planner import plan_run
from hybrid_engine.planner.refit import Replanner
from hybrid_engine.parallel.pipeline import graphs
from hybrid_engine.planner.run_plan import with_plan
from hybrid_engine.planner.grids import grid_table
from .update_settings import update_settings
from .plan_fallback import FirstStepOutOfMemory, release, take_next
from .trainer import RunState, Trainer, TrainingStopped, build_engine


def build_parser(prog: str | None = None):
    """The command line of the driver: every configuration field and every registered model's options."""
    return flags.build_parser(registry.options(), prog)


def parse_config(argv: list[str] | None, prog: str | None = None) -> RunConfig:
    """The run described by flags over a --config file over the defaults, for the models of the registry."""
    return flags.parse_config(argv, registry.options(), prog)


def validate_launch(cfg: RunConfig, env: LaunchEnv, device_type: str, argv: list[str], prog: str) -> object:
    """cfg.validate for this launch; without a launcher, a grid of several ranks says how to start them."""
    try:
        return cfg.validate(env.world_size, device_type, registry.check_model)
    except ConfigError as exc:
        p = cfg.parallel
        needed = (p.dp or 1) * p.cp * p.pp * p.mp
        if env.launched or env.world_size != 1 or needed <= 1 or "world size 1" not in str(exc):
            raise
        script = prog if prog.endswith(".py") else "-m hybrid_engine"
        raise ConfigError(f"{exc} (this is one process: to start {needed} ranks, run torchrun --nproc_per_node="
                          f"{needed} {script} {shlex.join(argv)})") from None


def device_type(choice: str) -> str:
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def pick_device(choice: str, local_rank: int) -> torch.device:
    if device_type(choice) == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda but no CUDA GPU is visible")
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs are visible")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(env: LaunchEnv, device: torch.device, timeout_s: float) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    # reached (or served, by rank 0 without torchrun) within timeout_s, or one line: a plain TCPStore client waits
    # forever on a MASTER_PORT that another program holds
    store = faults.rendezvous_store(env.rank, env.world_size, timeout_s)
    if store is None:  # one process without a launcher: a store in this process, no port to pick or collide on
        store = dist.HashStore()
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is not None and faults.uses_agent_store():
        # torchrun's agent keeps one store across --max-restarts attempts: without a prefix per attempt, a restarted
        # run finds the dead attempt's gloo/NCCL addresses under the same keys and fails connecting to them.
        store = dist.PrefixStore(f"hybrid_engine/attempt_{attempt}/", store)
    try:
        dist.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    except dist.DistStoreError as exc:  # c10d says which store key it waited for; the user needs who is missing
        if "timeout" not in str(exc):
            raise
        raise faults.JoinTimeout(
            f"not every one of the {env.world_size} ranks joined the process group within --comm-timeout "
            f"{timeout_s:g} s: a rank was not started, failed before joining, or was given another MASTER_ADDR, "
            "MASTER_PORT or WORLD_SIZE") from None


def main(argv: list[str] | None = None, *, heartbeat: faults.Heartbeat | None = None,
         state: RunState | None = None, prog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prog = prog or os.path.basename(sys.argv[0])
    # 1. the configuration, checked on every rank before any collective
    cfg = parse_config(argv, prog)
    env = LaunchEnv.from_environ()
    if cfg.plan.only:  # the planner's ranked grids and plans for this world size and model; no training
        p = cfg.parallel
        world = env.world_size if env.launched else (p.dp or 1) * p.cp * p.pp * p.mp
        table = grid_table(cfg, world, device_type(cfg.parallel.device), registry.check_model, user_flags=argv)
        if env.rank == 0:
            try:
                print(table, flush=True)
            except BrokenPipeError:  # its reader left (--plan-only | head): nothing more to say
                return entry.pipe_closed()
        return 0
    grid = validate_launch(cfg, env, device_type(cfg.parallel.device), argv, prog)  # what the user gave
    device = pick_device(cfg.parallel.device, env.local_rank)
    # What the schedule flags leave to auto, planned from what every rank reads alike: the same plan everywhere.
    asked = cfg.schedule
    cfg, plan = plan_run(cfg, grid, device.type, registry.check_model)
    grid = validate_launch(cfg, env, device.type, argv, prog)  # the plan, through the same checks
    check_output_paths(cfg, flags.config_file(argv))
    workload = registry.build_workload(cfg, device)  # the model (meta), loss, cut and data; data files read here
    cuda_graphs = graphs.check_run(cfg, workload, grid, device.type)  # on that the run cannot meet: exit 2 here
    # a launcher's restart (torchrun --max-restarts) or SLURM's requeue (sbatch --requeue, a preemption)
    start_from = checkpoint_to_start_from(cfg, workload, restarted=env.attempt > 0 or slurm.requeue_count() > 0,
                                          settings=update_settings(cfg, registry.entry(cfg.model.name).clip_grad))
    fault_plan = FaultPlan.from_test_environ()  # the documented test hooks, read here and nowhere else

    # 2. processes and groups
    if cfg.parallel.memory_cap_gib is not None and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.parallel.memory_cap_gib * 2**30 / total), device)
    init_distributed(env, device, cfg.parallel.comm_timeout)
    if heartbeat is not None:
        heartbeat.start(cfg.parallel.comm_timeout)  # lets the others name this rank if it is lost (runtime/faults.py)
    checkpoint.agree_on_directory_holds()  # --save DIR in use by another run: every rank stops here, exit 2
    places = [None] * env.world_size
    dist.all_gather_object(places, (host_name(), str(device)))
    nodes = NodeMap(tuple(h for h, _ in places))
    # an MP group across hosts: every rank finds it alike (exit 2, said once), or rank 0 warns under the flag
    cross_node = check_mp_within_nodes(grid, nodes, cfg.parallel.allow_cross_node_mp)
    groups = build_groups(grid, env.rank, timeout_s=cfg.parallel.comm_timeout)
    if env.rank == 0:
        print(mapping_table(grid, nodes, [d for _, d in places]))
        print(grid_picture(grid, nodes), flush=True)
        if cross_node:
            print(cross_node, flush=True)
    check_communication(groups, nodes, device, cfg.parallel.comm_timeout)

    # 3. the engine and the loop
    if env.rank == 0:
        if asked.unset:  # said with the other start-up lines, after the checks that may still refuse the run
            print(plan.line())
        print(workload.describe())
        print(workload.describe_layout(grid.pp_size * cfg.schedule.virtual_stages, grid.pp_size,
                                       cfg.schedule.placement), flush=True)
    predicted, fallback = plan.chosen, bool(asked.unset)  # a plan the user gave is not the planner's to change
    while True:
        engine = build_engine(cfg, workload, groups, device, cuda_graphs)
        if state is not None:  # a step that hangs is then named by its stage, action, peer and collective
            state.hang = hang_report.HangReport(
                hang_report.Placement(env.rank, tuple(groups.pp_ranks), tuple(grid.group_of(env.rank, "dp")),
                                      tuple(grid.group_of(env.rank, "mp")), nodes.hosts), engine.activity)
        try:
            replanner = (Replanner.for_run(graphs.as_chosen(cfg, cuda_graphs), asked, grid, device.type,
                                           registry.check_model, plan)
                         if plan.by_time and fallback else None)
            Trainer(cfg, engine, workload, grid, groups, device, faults_plan=fault_plan, state=state,
                    predicted=predicted if plan.by_time else None, fallback=fallback,
                    replanner=replanner).train(start_from)
            break
        except FirstStepOutOfMemory as exc:
            failed = exc.with_traceback(None)  # its frames would keep the failed step's tensors alive
        if state is not None:
            state.hang = None
        release(engine, device)
        engine = None
        predicted, line = take_next(plan, failed)
        if predicted is None:
            raise TrainingStopped(line)
        if env.rank == 0:
            print(line, flush=True)
        cfg, fallback = with_plan(cfg, predicted.plan), False  # once: a second failure ends the run
        grid = validate_launch(cfg, env, device.type, argv, prog)
        cuda_graphs = graphs.check_run(cfg, workload, grid, device.type)
        fault_plan = dataclasses.replace(fault_plan, oom_at_step=None)  # injected under the first plan only
    engine.close()  # the executor holds process groups: release them before the groups are destroyed
    dist.destroy_process_group()
    return 0


def check_communication(groups: GridGroups, nodes: NodeMap, device: torch.device, timeout_s: float) -> None:
    """One small collective on every group this rank belongs to, before the first step (runtime/comm_check.py): a
    group that does not answer is named; rank 0 prints how long each axis took."""
    timings = comm_check.check_groups(groups.named_groups(), nodes.describe_ranks, device, timeout_s)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, timings)
    if groups.rank == 0 and any(every):
        print(comm_check.summary(every, nodes.describe_ranks), flush=True)


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default  # LaunchEnv reports the bad value


def run(argv: list[str] | None = None, prog: str | None = None) -> int:
    """The process's entry (the console script, `python -m hybrid_engine`, hybrid_engine.py): a run that ends well
    ends the process with exit code 0 from here. Every failure becomes one line on stderr and a non-zero exit;
    HYBRID_ENGINE_DEBUG=1 raises with the traceback instead. Exit codes: 0 done, 2 bad input, 1 training stopped (NaN loss) or a failure (a lost peer: the line names it), 130 Ctrl-C,
    143 SIGTERM. An error every rank finds alike is printed once; a rank's own error by that rank. A task of a
    bare `srun` step first takes its rank and rendezvous from SLURM's variables (runtime/slurm.py)."""
    try:
        gpus = torch.cuda.device_count() if slurm.is_srun_task(os.environ) else 0
        srun = slurm.adopt_srun_environment(visible_gpus=gpus)
        if srun:
            slurm.check_rendezvous_host()
    except ConfigError as exc:  # before any rank exists: task 0 says what every task finds alike
        if slurm.speaks_for_error(os.environ):
            faults.say(f"hybrid_engine: error: {exc}")
        return 2
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    if srun and rank == 0:
        print(srun, flush=True)
    heartbeat = faults.Heartbeat(rank, world)
    state = RunState()
    reporter = faults.SigtermReporter(rank, heartbeat, where=state.where)
    interrupts = InterruptReporter(rank, reporter, heartbeat, state).install()  # before any thread starts
    reporter.install()

    def claim(code: int) -> None:
        if not reporter.leaving(code):
            threading.Event().wait()  # a signal thread is reporting and ends the process

    def end(code: int) -> NoReturn:
        """Leave now, skipping the interpreter's teardown (about 0.6 s of a core per rank with torch loaded): in
        it a thread caught inside a store call aborts the process, and it restores the default SIGTERM handler, so
        a rank still tearing down when torchrun stops the others (once one has exited) would be reported as killed
        instead of exiting with `code` like them. Every file the run wrote is closed by then."""
        heartbeat.linger()  # without torchrun this rank may serve the store the others are still reading
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def leave_agreed(code: int, message: str) -> int:
        claim(code)
        if dist.is_initialized():  # the heartbeat runs (and others watch it) only once the process group exists
            heartbeat.note_exit()
        heartbeat.stop()
        speak, alike = agree_on_error(rank, world, message)
        if speak:
            faults.say(f"hybrid_engine: error: {message}" if alike else f"hybrid_engine: rank {rank}: error: {message}")
        else:
            time.sleep(0.2)  # let the rank that speaks go first
        reporter.reported()
        if world > 1:
            end(code)
        return code

    try:
        code = main(argv, heartbeat=heartbeat, state=state, prog=prog)
        reporter.leaving(code)
        heartbeat.note_exit()
        heartbeat.stop()
        end(code)
    except ConfigError as exc:
        return leave_agreed(2, str(exc))
    except TrainingStopped as exc:
        return leave_agreed(1, str(exc))
    except faults.RendezvousError as exc:  # no store: no peer to name or to wait for
        claim(1)
        faults.say(f"hybrid_engine: rank {rank}: {exc}")
        reporter.reported()
        return 1
    except KeyboardInterrupt:  # only where the SIGINT thread could not be installed (not the main thread)
        interrupts.report()  # exits 130, unless another exit is being reported: that one ends the process
        threading.Event().wait()
    except Exception as exc:  # noqa: BLE001 - the driver's job is to turn any failure into one clear line
        if os.environ.get("HYBRID_ENGINE_DEBUG"):
            heartbeat.stop()
            raise
        # gloo prefixes "[.../pair.cc:537] " and appends advice; the first sentence is what a user needs
        first = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).splitlines()[0] if str(exc) else "")
        what = f"{type(exc).__name__}: {first.split('. ')[0]}"
        if isinstance(exc, (comm_check.CommCheckError, faults.JoinTimeout)):  # its message is the whole line
            what = str(exc)
        claim(1)
        heartbeat.note_exit()
        lost = heartbeat.describe_loss()  # a lost peer is the usual cause: watch the heartbeats a moment to name it
        where = state.where()  # inside a step: the stage, action, peer and collective it waited on
        stalled = f"{where[0]}; " if where else ""
        faults.say(f"hybrid_engine: rank {rank}: {lost + '; ' if lost else ''}{stalled}{what}")
        if where and world > 1 and hang_report.is_timeout(first) and heartbeat.store_answers():
            # rank 0 lines up every rank's wait, at a store that still answers
            summary = hang_report.check_in(rank, world, where[1], heartbeat.departed(), min(10.0, heartbeat.timeout_s))
            if summary:
                faults.say(summary)
        heartbeat.end_frozen()  # a stopped peer this rank's line named
        reporter.reported()
        answer_the_waiting(rank, world, what)  # peers that left on errors of their own wait at this rank's store
        if world > 1:  # peers are gone or going: skip process-group teardown, which could wait on them
            heartbeat.linger()
            sys.stdout.flush()
            os._exit(1)
        return 1
    finally:
        heartbeat.stop()  # a heartbeat thread still inside a store call at interpreter exit aborts the process
