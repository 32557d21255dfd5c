"""The command line's flags and --config files, mapped onto RunConfig (hybrid_engine/config/run.py).

Flags not given stay out of the parsed namespace (argparse.SUPPRESS), so a --config file's values stand unless a
flag overrides them; every flag's help states its real default once, taken from the config dataclasses.
"""
from __future__ import annotations

import argparse
import sys

from .checks import DEVICES, OPTIMIZERS
from .run import ModelConfig, RunConfig
from .engine import SCHEDULES, ConfigError, AMP_IMPLS, AMP_MODES, DP_GRAD_DTYPES, STAGE_IMPLS
from .input_files import read_regular_file

EPILOG = """\
examples:
  one process on the CPU:
    python hybrid_engine.py --dim 256 --depth 4 --steps 20
  8 ranks on one node (CPU + gloo without GPUs; with 8 GPUs, one GPU per rank, CUDA + NCCL):
    torchrun --nproc_per_node=8 hybrid_engine.py --dp 2 --pp 2 --mp 2
  8 GPUs, fp16, zero-bubble schedule, checkpoints every 100 steps (restartable):
    torchrun --nproc_per_node=8 --max-restarts 3 hybrid_engine.py --dp 2 --pp 2 --mp 2 --amp fp16 \\
        --schedule zb1 --merge-wgrad --steps 1000 --save runs/ckpt --save-every 100 --resume
  a run described in a file (one table per part: [parallel], [model], [data], [optimizer], [training],
  [checkpoint], [reporting], [schedule], [stages], [precision], [data_parallel]); flags override it:
    torchrun --nproc_per_node=8 hybrid_engine.py --config run.toml --steps 100
  (python -m hybrid_engine and the hybrid-engine command take the same flags)
  torchrun's arguments and agent without its warnings and tracebacks, exiting with the ranks' own code:
    python -m hybrid_engine.launch --nproc_per_node=8 hybrid_engine.py --dp 2 --pp 2 --mp 2

environment:
  HYBRID_ENGINE_DEBUG=1                  a failure raises with its full traceback instead of one line
  HYBRID_ENGINE_TEST_KILL_AT_STEP=S      test hooks (first attempt only, see hybrid_engine/runtime/fault_plan.py):
  HYBRID_ENGINE_TEST_KILL_RANK=R           rank R (default 0) SIGKILLs itself as step S begins,
  HYBRID_ENGINE_TEST_CRASH_IN_SAVE=S       or dies writing its shard of checkpoint S;
  HYBRID_ENGINE_TEST_NAN_AT_STEP=S         NaN inputs at step S

exit codes: 0 done; 2 bad input (flags, grid, checkpoint); 1 training stopped (NaN loss) or a failure (a lost
peer: the line names it); 130 Ctrl-C (SIGINT); 143 SIGTERM. Under torchrun the shell sees torchrun's own code
(1 when any rank failed, whatever the rank's code); its report names the first rank that failed and its code.
python -m hybrid_engine.launch exits with that rank's code.
"""

# flag dest -> (RunConfig table, field)
FIELDS = {
    "dp": ("parallel", "dp"), "pp": ("parallel", "pp"), "mp": ("parallel", "mp"), "order": ("parallel", "order"),
    "device": ("parallel", "device"), "memory_cap_gib": ("parallel", "memory_cap_gib"),
    "comm_timeout": ("parallel", "comm_timeout"), "dp_grad_dtype": ("data_parallel", "grad_dtype"),
    "zero": ("data_parallel", "zero"), "overlap_param_gather": ("data_parallel", "overlap_param_gather"),
    "schedule": ("schedule", "name"), "micro_batches": ("schedule", "micro_batches"),
    "virtual_stages": ("schedule", "virtual_stages"), "lookahead": ("schedule", "lookahead"),
    "merge_wgrad": ("schedule", "merge_weight_grads"), "stage_impl": ("stages", "impl"),
    "recompute": ("stages", "recompute"), "compile": ("stages", "compile"), "tp_chunks": ("stages", "tp_chunks"),
    "dim": ("model", "dim"), "depth": ("model", "depth"), "seed": ("model", "seed"), "model": ("model", "name"),
    "layers": ("model", "layers"), "hidden": ("model", "hidden"), "heads": ("model", "heads"),
    "seq_len": ("model", "seq_len"), "tie_embeddings": ("model", "tie_embeddings"),
    "sequence_parallel": ("model", "sequence_parallel"), "selective_recompute": ("model", "selective_recompute"),
    "fp32_residual": ("model", "fp32_residual"),
    "data": ("data", "path"), "eval_every": ("training", "eval_every"),
    "batch_size": ("data", "batch_size"), "stream_data": ("data", "stream"),
    "steps": ("training", "steps"), "warmup": ("training", "warmup"), "log_every": ("training", "log_every"),
    "spike_factor": ("training", "spike_factor"),
    "optimizer": ("optimizer", "name"), "lr": ("optimizer", "lr"),
    "amp": ("precision", "amp"), "amp_impl": ("precision", "implementation"),
    "loss_scale": ("precision", "loss_scale"), "scale_window": ("precision", "scale_window"),
    "hysteresis": ("precision", "hysteresis"), "clip_grad": ("precision", "clip_grad"),
    "metrics": ("reporting", "metrics"), "quiet": ("reporting", "quiet"), "trace": ("reporting", "trace"),
    "save": ("checkpoint", "save"), "save_every": ("checkpoint", "save_every"),
    "keep_checkpoints": ("checkpoint", "keep"), "resume": ("checkpoint", "resume"), "load": ("checkpoint", "load"),
}
_DEFAULTS = RunConfig()


def _default(dest: str) -> str:
    table, name = FIELDS[dest]
    value = getattr(getattr(_DEFAULTS, table), name)
    return f"(default {({True: 'on', False: 'off'}[value]) if isinstance(value, bool) else value})"


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (printed once) and exit code 2."""

    def error(self, message: str):  # noqa: D102
        raise ConfigError(message)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """Every flag, with its real default (from the config dataclasses) written once in its help. Flags not
    given stay out of the namespace (argparse.SUPPRESS), so a --config file's values stand unless overridden."""
    p = _OneLineParser(
        prog=prog, argument_default=argparse.SUPPRESS, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Data x pipeline x tensor parallel training of the course MLP (depth x [Linear(dim, dim) + ReLU],\n"
        "MSE against a fixed random teacher) with a C++ core. Flags override a --config file's values.")
    p.add_argument("--config", metavar="TOML", help="read the run from this TOML file; flags override it")
    switch = argparse.BooleanOptionalAction

    g = p.add_argument_group("grid")
    g.add_argument("--dp", type=int, metavar="N", help="data-parallel replicas (default: world size / (pp x mp))")
    g.add_argument("--pp", type=int, metavar="N", help=f"pipeline-parallel stages (ranks per pipeline) {_default('pp')}")
    g.add_argument("--mp", type=int, metavar="N", help=f"tensor (model) parallel ranks per layer {_default('mp')}")
    g.add_argument("--order", metavar="AXES", help="rank layout: mp, dp and pp joined by '-', fastest-varying first "
                   f"(mp-dp-pp, mp-pp-dp, dp-mp-pp, dp-pp-mp, pp-mp-dp, pp-dp-mp); the default keeps MP peers on "
                   f"adjacent ranks {_default('order')}")
    g.add_argument("--device", choices=DEVICES,
                   help=f"auto: CUDA + NCCL when GPUs exist, else CPU + gloo {_default('device')}")
    g.add_argument("--memory-cap-gib", type=float, metavar="GIB",
                   help="CUDA: let this process allocate at most this much GPU memory (default: no cap)")
    g.add_argument("--comm-timeout", type=float, metavar="SECONDS",
                   help=f"how long a collective may wait for a peer before this rank gives up {_default('comm_timeout')}")
    g.add_argument("--dp-grad-dtype", choices=tuple(DP_GRAD_DTYPES),
                   help="dtype of the gradients on the wire in the DP all-reduce: bf16 halves the bytes, rounding "
                        f"each replica's gradient and their sum to bf16 (accumulation stays fp32) {_default('dp_grad_dtype')}")
    g.add_argument("--zero", type=int, choices=(0, 1),
                   help="1: the distributed optimizer (ZeRO-1): fp32 masters and optimizer state sharded over DP, "
                        f"gradient buckets reduce-scattered, the updated weights all-gathered {_default('zero')}")
    g.add_argument("--overlap-param-gather", action=switch,
                   help="with --zero 1: each bucket's weight all-gather overlaps the next forward, waited for by the "
                        f"first layer that reads it; off: all waited for at the end of the step {_default('overlap_param_gather')}")

    s = p.add_argument_group("pipeline schedule and stages")
    s.add_argument("--schedule", choices=SCHEDULES, help=f"pipeline schedule {_default('schedule')}")
    s.add_argument("--micro-batches", type=int, metavar="M",
                   help=f"micro-batches per DP rank per step {_default('micro_batches')}")
    s.add_argument("--virtual-stages", type=int, metavar="V",
                   help=f"model chunks per rank (interleaved only) {_default('virtual_stages')}")
    s.add_argument("--lookahead", type=int, metavar="K",
                   help="1f1b/zb1: forwards every rank but the last runs beyond the 1F1B warm-up; hides the "
                        "gradient's round trip at the cost of K more micro-batches of activations "
                        f"{_default('lookahead')}")
    s.add_argument("--merge-wgrad", action=switch,
                   help="zb1 only: compute each stage's weight gradients once over all micro-batches (one GEMM) "
                        f"{_default('merge_wgrad')}")
    s.add_argument("--stage-impl", choices=STAGE_IMPLS,
                   help="auto/native: Linear(+ReLU) stages run as one native C++ chain in the executor; autograd: "
                        f"module by module through autograd (for comparison) {_default('stage_impl')}")
    s.add_argument("--recompute", action=switch,
                   help=f"activation recomputation: keep only stage inputs between forward and backward {_default('recompute')}")
    s.add_argument("--compile", action=switch,
                   help=f"run autograd stages under torch.compile {_default('compile')}")
    s.add_argument("--tp-chunks", type=int, metavar="N",
                   help="native tensor-parallel chains: row chunks per micro-batch, so the MP all-reduce of one "
                        "chunk runs under the next one's GEMMs (0: auto, which does not split: on 4 x H200 "
                        f"splitting cost more than it hid) {_default('tp_chunks')}")

    m = p.add_argument_group("model and data")
    m.add_argument("--model", choices=("mlp", "gpt"),
                   help=f"the course MLP, or a decoder-only transformer (GPT) {_default('model')}")
    m.add_argument("--dim", type=int, help=f"MLP: hidden size of every Linear layer {_default('dim')}")
    m.add_argument("--depth", type=int, help=f"MLP: number of Linear + ReLU blocks {_default('depth')}")
    m.add_argument("--layers", type=int, help=f"GPT: transformer blocks {_default('layers')}")
    m.add_argument("--hidden", type=int, help=f"GPT: hidden size {_default('hidden')}")
    m.add_argument("--heads", type=int, help=f"GPT: attention heads (divisible by --mp) {_default('heads')}")
    m.add_argument("--seq-len", type=int, help=f"GPT: tokens per sequence {_default('seq_len')}")
    m.add_argument("--tie-embeddings", action=switch,
                   help=f"GPT: the LM head shares the token embedding {_default('tie_embeddings')}")
    m.add_argument("--sequence-parallel", action=switch,
                   help="GPT: split LayerNorm/residual regions along the sequence over MP "
                        f"{_default('sequence_parallel')}")
    m.add_argument("--selective-recompute", action=switch,
                   help="GPT: recompute only the attention core in the backward (--recompute: whole stages) "
                        f"{_default('selective_recompute')}")
    m.add_argument("--fp32-residual", action=switch,
                   help="GPT with --amp half weights: keep the residual stream (block inputs and outputs, the "
                        "activations between stages) in fp32; LayerNorms normalise it in fp32 "
                        f"{_default('fp32_residual')}")
    m.add_argument("--data", metavar="PATH",
                   help="GPT: a text file (byte-level) or a token file (python -m hybrid_engine.data prepare IN OUT) "
                        "(default: the built-in seeded Markov corpus, whose entropy rate is known)")
    m.add_argument("--seed", type=int, help=f"initial weights and data depend on this alone {_default('seed')}")
    m.add_argument("--batch-size", type=int, metavar="B",
                   help=f"global batch size (all DP replicas together) {_default('batch_size')}")
    m.add_argument("--stream-data", action=switch,
                   help="draw each micro-batch when its forward runs instead of the whole batch before the step: "
                        f"the batch is never resident (a larger largest batch) {_default('stream_data')}")

    t = p.add_argument_group("training")
    t.add_argument("--steps", type=int, metavar="N",
                   help=f"optimizer steps in all, counted from step 0 (0: set up, print the grid, stop) {_default('steps')}")
    t.add_argument("--eval-every", type=int, metavar="N",
                   help=f"GPT: validation loss on the held-out ~1%% every N steps and after the last {_default('eval_every')}")
    t.add_argument("--warmup", type=int, metavar="N",
                   help=f"this run's first N steps, left out of the timing summary {_default('warmup')}")
    t.add_argument("--spike-factor", type=float, metavar="F",
                   help="stop when a step's loss is more than F times the largest of the 20 before it (0: never); "
                        "a checkpoint becomes latest only once the step that trains on it has a finite loss within "
                        f"F {_default('spike_factor')}")
    t.add_argument("--optimizer", choices=OPTIMIZERS,
                   help="sgd (plain; fused with the master->half cast under --amp), adam, or adamw (decoupled "
                        f"weight decay 0.01); torch's other defaults {_default('optimizer')}")
    t.add_argument("--lr", type=float, help=f"learning rate {_default('lr')}")

    a = p.add_argument_group("mixed precision")
    a.add_argument("--amp", choices=AMP_MODES,
                   help=f"half-precision compute: fp16 (CUDA, dynamic loss scaling) or bf16 {_default('amp')}")
    a.add_argument("--amp-impl", choices=AMP_IMPLS,
                   help="half-weights: half weights for the whole step with fp32 masters and fp32 gradient "
                        f"accumulation; autocast: fp32 weights cast per matrix product {_default('amp_impl')}")
    a.add_argument("--loss-scale", type=float, help="fp16: a static loss scale (default: dynamic)")
    a.add_argument("--scale-window", type=int, metavar="N",
                   help=f"fp16: clean steps before the scale doubles {_default('scale_window')}")
    a.add_argument("--hysteresis", type=int, metavar="N",
                   help=f"fp16: overflows tolerated before the scale halves {_default('hysteresis')}")
    a.add_argument("--clip-grad", type=float, metavar="NORM",
                   help=f"clip the global gradient norm to this (0: off) {_default('clip_grad')}")

    r = p.add_argument_group("reporting (rank 0)")
    r.add_argument("--metrics", metavar="PATH", help="write one JSON line per step to PATH (default: none)")
    r.add_argument("--quiet", action=switch, help=f"no per-step lines, only the summary {_default('quiet')}")
    r.add_argument("--log-every", type=int, metavar="N",
                   help="print every N-th step's line when stdout is not a terminal (a terminal gets one live "
                        f"status line: step, loss, throughput, ETA) {_default('log_every')}")
    r.add_argument("--trace", metavar="PATH",
                   help="time every action of the last step; write PATH.json (Chrome trace), PATH.png and "
                        "PATH.simulated.png, and report the measured bubble (default: off)")

    c = p.add_argument_group("checkpoints (see docs/failures.md)")
    c.add_argument("--save", metavar="DIR",
                   help="write checkpoints under DIR (DIR/step_N, DIR/latest); must be visible to every rank "
                        "(default: none)")
    c.add_argument("--save-every", metavar="N", type=int,
                   help=f"also save after every N steps (0: only after the last step) {_default('save_every')}")
    c.add_argument("--keep-checkpoints", metavar="K", type=int,
                   help=f"keep the newest K checkpoints {_default('keep_checkpoints')}")
    c.add_argument("--resume", action=switch,
                   help="continue from the latest checkpoint in --save DIR if there is one, else start as usual "
                        f"(from --load, or from scratch): what a restarted job needs {_default('resume')}")
    c.add_argument("--load", metavar="PATH",
                   help="start from this checkpoint (DIR/step_N, or a --save DIR: its latest), on any grid; "
                        "--steps counts from step 0, so training continues at the checkpoint's step (default: none)")
    return p


MAX_CONFIG_BYTES = 16 << 20


def read_toml(path: str) -> dict:
    """A --config file as {table: {key: value}}; a missing, unreadable or malformed file is one ConfigError. Only
    a regular file is read (never waiting on a FIFO), up to 16 MiB, as UTF-8."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    raw = read_regular_file(path, MAX_CONFIG_BYTES, f"--config {path}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--config {path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}): "
                          "a TOML file is text") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"--config {path} nests arrays or tables too deeply to read: not a run description") from None


def parse_config(argv: list[str] | None = None, prog: str | None = None) -> RunConfig:
    """Flags over the --config file over the dataclasses' defaults."""
    given = vars(build_parser(prog).parse_args(argv))
    path = given.pop("config", None)
    tables = read_toml(path) if path else {}
    for dest, value in given.items():
        table, name = FIELDS[dest]
        section = tables.setdefault(table, {})
        if isinstance(section, dict):
            section[name] = value
    _refuse_other_models_flags(tables.get("model", {}))
    return RunConfig.from_tables(tables, source=f"--config {path}" if path else "flags")


def _refuse_other_models_flags(model: dict) -> None:
    """GPT-only flags with the MLP, and MLP-only flags with the GPT, are mistakes, not silently ignored."""
    if not isinstance(model, dict):
        return
    gpt = model.get("name", ModelConfig.name) == "gpt"
    stray = [k for k in (ModelConfig.MLP_ONLY if gpt else ModelConfig.GPT_ONLY) if k in model]
    if stray:
        flags = ", ".join("--" + k.replace("_", "-") for k in stray)
        raise ConfigError(f"{flags} {'apply' if len(stray) > 1 else 'applies'} to --model "
                          f"{'mlp' if gpt else 'gpt'} only (this run trains --model {'gpt' if gpt else 'mlp'})")
