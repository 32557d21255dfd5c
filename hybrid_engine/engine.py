"""Engine: wires grid groups, stages, schedule, C++ executor, DP gradient sync and optimizer.

One `train_step` is one optimizer step over this DP rank's slice of the global batch, cut into
micro-batches that the C++ executor pushes through this rank's pipeline stages in schedule order.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from . import _C
from .amp import OverflowWatch, clip_grad_norm, make_loss_scaler
from .grid import ACTIVATION, GridGroups
from .models import materialize
from .partition import partition, stages_of_rank
from .precision import MasterWeights, Precision
from .schedule import make_schedule
from .tp_layers import Linear, gather_full, is_mp_split, parallelize_mlp, take_shard

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# A step's data on one rank: the whole slice, a callable micro -> that micro-batch, or None (not consumed here).
MicroBatches = torch.Tensor | Callable[[int], torch.Tensor] | None


@dataclass
class StepResult:
    loss: float  # mean loss over the global batch (same value on every rank)
    step_time_s: float
    skipped: bool = False
    loss_scale: float | None = None
    grad_norm: float | None = None


def _chain_of(stage: nn.Sequential) -> tuple[list, list[bool]] | None:
    """(params, relu flags) if the stage is a plain chain of our Linear layers, each optionally followed by a
    ReLU — the shape the C++ linear_chain runs as one autograd node; else None."""
    params: list = []
    relu: list[bool] = []
    for module in stage:
        if isinstance(module, Linear):
            params += [module.weight, module.bias]
            relu.append(False)
        elif isinstance(module, nn.ReLU) and relu and not relu[-1] and not module.inplace:
            relu[-1] = True
        else:
            return None
    return (params, relu) if relu else None


def _stage_runner(stages: dict[int, nn.Sequential], chains: dict[int, tuple[list, list[bool]] | None],
                  precision: Precision, device: torch.device,
                  recompute: bool) -> Callable[[int, torch.Tensor], torch.Tensor]:
    """Runs one stage's forward. A stage with a fused chain (`chains`) runs as one C++ autograd node
    (csrc/tp/linear_chain.h) — a fraction of the host time of module-by-module execution; any other stage
    runs its own forward. With recompute, only each stage's input stays alive between forward and backward
    (the chain reruns its forward; other stages use torch checkpointing)."""

    def run(stage: int, x: torch.Tensor) -> torch.Tensor:
        chain = chains.get(stage)
        if chain is not None and x.dim() == 2:
            return _C.linear_chain(x, *chain, recompute)
        with precision.stage_context(device):
            if recompute and torch.is_grad_enabled():
                return torch.utils.checkpoint.checkpoint(stages[stage], x, use_reentrant=False)
            return stages[stage](x)

    return run


def plain_sgd_lr(optimizer: torch.optim.Optimizer) -> float | None:
    """The learning rate if `optimizer` is torch.optim.SGD whose every group is a plain `p -= lr * grad`
    (read at each step, so LR schedulers and edits of param_groups apply); else None."""
    if type(optimizer) is not torch.optim.SGD:
        return None
    groups = optimizer.param_groups
    plain = all(g["momentum"] == 0 and g["weight_decay"] == 0 and not g["nesterov"] and not g["maximize"]
                and g["lr"] == groups[0]["lr"] for g in groups)
    return float(groups[0]["lr"]) if plain else None


def _micro_batch_fn(data: MicroBatches, micro_batches: int, dtype: torch.dtype | None,
                    what: str) -> Callable[[int], torch.Tensor]:
    """micro -> that micro-batch (in `dtype` when given), from a callable or from a whole slice (chunked once)."""
    if callable(data):
        def fetch(micro: int) -> torch.Tensor:
            batch = data(micro)
            if not isinstance(batch, torch.Tensor):
                raise TypeError(f"{what}({micro}) must return a tensor, got {type(batch).__name__}")
            return batch.to(dtype) if dtype is not None else batch
        return fetch
    chunks = (data.to(dtype) if dtype is not None else data).chunk(micro_batches)
    return lambda micro: chunks[micro]


def _micro_loss(loss_fn: LossFn) -> LossFn:
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return loss_fn(output.float(), target.float())

    return loss


class Engine:
    """Hybrid DP x PP x MP training of an nn.Sequential.

    model: the whole model (any device, or meta: see `materialize`); this rank keeps only its stages.
    loss_fn: (output, target) -> scalar mean loss of one micro-batch.
    groups: this rank's process groups (hybrid_engine.grid.build_groups).
    tensor_parallel: split nn.Linear layers Megatron-style over the MP group (column then row parallel);
        with mp=1 they become our deferrable-weight-gradient Linear, which zb1 needs to split I from W.
    fuse_stages: run a stage that is a plain Linear(+ReLU) chain as one C++ autograd node.
    recompute: activation recomputation; keep only stage inputs between a micro-batch's forward and backward.
    lookahead: 1f1b/zb1 only: forwards every rank but the last runs ahead of the 1F1B warm-up, so that the
        gradient's round trip through the later stages overlaps work (one more live micro-batch each).
    dp_bucket_mb: size cap (MiB of gradient) of a DP all-reduce bucket; buckets hold whole layers, last layer
        first, and each is launched as soon as its gradients are final in the step's last backward.
    dp_grad_dtype: the dtype gradients travel in for the DP all-reduce (None: their own, fp32); torch.bfloat16
        halves the bytes on the link at the price of rounding each replica's gradient and their sum to bf16
        (accumulation stays fp32). Like DDP's bf16_compress_hook; opt-in.
    native_stages: with fuse_stages, the executor runs each fused chain itself, without autograd (no graph, the
        backward on the executor's thread, and with F.mse_loss the loss's gradient computed with the loss);
        False keeps them as autograd nodes called through Python (the A/B baseline).
    """

    def __init__(
        self,
        model: nn.Sequential,
        loss_fn: LossFn,
        groups: GridGroups,
        *,
        schedule: str = "1f1b",
        micro_batches: int = 4,
        virtual_stages: int = 1,
        optimizer: str = "sgd",
        lr: float = 1e-3,
        device: torch.device | str = "cpu",
        tensor_parallel: bool = True,
        merge_weight_grads: bool = False,
        trace: bool = False,
        precision: Precision = Precision(),
        loss_scale: float | None = None,
        scale_window: int = 2000,
        hysteresis: int = 1,
        clip_grad: float = 0.0,
        fuse_stages: bool = True,
        recompute: bool = False,
        lookahead: int = 0,
        dp_bucket_mb: float = 256.0,
        native_stages: bool = True,
        dp_grad_dtype: torch.dtype | None = None,
    ):
        if dp_grad_dtype not in (None, torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dp_grad_dtype must be None, torch.float32, torch.bfloat16 or torch.float16, got "
                             f"{dp_grad_dtype}")
        self.groups = groups
        self.grid = groups.grid
        self.device = torch.device(device)
        self.loss_fn = loss_fn
        self.micro_batches = micro_batches
        self.schedule_name = schedule
        coords = groups.coords
        self.pp_rank, self.pp_size, self.dp_size = coords.pp, self.grid.pp_size, self.grid.dp_size
        self.num_stages = self.pp_size * virtual_stages

        # Stages: partition the whole model, keep (and build) only this rank's chunks.
        self.stage_ids = stages_of_rank(self.pp_rank, self.pp_size, virtual_stages)
        layout = partition(model, self.num_stages)
        self.stage_layer_indices = {s: layout[s] for s in self.stage_ids}
        self.stages: dict[int, nn.Sequential] = {}
        for s in self.stage_ids:
            stage = materialize(nn.Sequential(*[model[i] for i in layout[s]]), self.device)
            if tensor_parallel:
                stage = parallelize_mlp(stage, groups.mp)
            self.stages[s] = stage
        self.precision = precision
        if precision.half_weights:
            for s in self.stage_ids:
                self.stages[s] = self.stages[s].to(precision.half_dtype)
        self.parameters = [p for s in self.stage_ids for p in self.stages[s].parameters()]
        # Who holds the fp32 gradients the optimizer reads: the parameters themselves, or their fp32 masters.
        self.masters = MasterWeights(self.parameters) if precision.half_weights else None
        self.optimized = self.masters.masters if self.masters else self.parameters

        self.lookahead = lookahead
        self.actions = make_schedule(schedule, self.pp_size, micro_batches, virtual_stages, lookahead)[self.pp_rank]
        if not dp_bucket_mb > 0:
            raise ValueError(f"dp_bucket_mb must be positive, got {dp_bucket_mb}")
        self._buckets, self._stage_buckets = self._make_grad_buckets(int(dp_bucket_mb * 2**20))
        self.optimizer = self._make_optimizer(optimizer, lr)
        self.scaler = make_loss_scaler(precision.amp, loss_scale, scale_window, hysteresis)
        self.overflow_watch = OverflowWatch(rank=groups.rank)
        self.clip_grad = clip_grad
        self._inject_nonfinite = False
        # Each stage's fused chain, (params, relu flags), or None: a stage that is not a plain Linear(+ReLU) chain,
        # or every stage without fusion or under autocast (which must see the modules).
        chains = {s: _chain_of(self.stages[s]) if fuse_stages and not precision.autocast else None
                  for s in self.stage_ids}
        # A closure over the stages, not a bound method: the executor holding it must not keep the Engine alive.
        self._runner = _stage_runner(self.stages, chains, precision, self.device, recompute)
        # Merged W over fused chains writes every gradient of the rank exactly once per step: the executor
        # may then overwrite the gradient buffers, and the step skips zeroing them.
        self._overwrite_grads = merge_weight_grads and all(c is not None for c in chains.values())
        self._merge_weight_grads = merge_weight_grads
        # Fused chains the executor may run without autograd.
        self._native_chains = chains if native_stages else {}
        self._recompute = recompute
        self._dp_grad_dtype = dp_grad_dtype
        self._trace = trace
        self._executor: _C.PipelineExecutor | None = None  # built on the first step, once shapes are known

    # ----------------------------------------------------------------------------------------------- setup
    def _make_grad_buckets(self, cap_bytes: int) -> tuple[list[torch.Tensor], dict[int, list[int]]]:
        """Flat gradient buffers ("buckets"), each optimized tensor's .grad a view into one of them, so backward
        accumulates straight into what the DP all-reduce sends. With half weights the views are also registered
        as the half parameters' fp32 main grads. Returns the buckets (every gradient in exactly one) and, per
        stage, its bucket ids.

        A bucket holds one stage's gradients of one dtype, whole layers (a module's own parameters), at most
        `cap_bytes` of them (a bigger layer gets a bucket of its own). Layers are packed in reverse order, the
        order backward finishes them: the executor launches a bucket's all-reduce as soon as its gradients are
        final, while the backward of the earlier layers goes on (csrc/executor/dp_grad_sync.h)."""
        owner = dict(zip(map(id, self.parameters), self.optimized))

        def layers_last_first(stage: nn.Module) -> list[list[nn.Parameter]]:
            # Each module's own trainable parameters (a layer's weight and bias: final at the same moment of
            # the backward, so never split apart), modules last to first; a shared parameter once.
            seen: set[int] = set()
            layers = []
            for module in reversed(list(stage.modules())):
                own = [p for p in module.parameters(recurse=False) if p.requires_grad and id(p) not in seen]
                seen.update(map(id, own))
                if own:
                    layers.append(own)
            return layers

        def split(layers: list[list[nn.Parameter]], cap_elements: int) -> list[list[nn.Parameter]]:
            # Consecutive layers while they fit the cap; a layer bigger than the cap is a bucket alone.
            runs: list[list[nn.Parameter]] = []
            size = cap_elements + 1
            for layer in layers:
                numel = sum(p.numel() for p in layer)
                if size + numel > cap_elements:
                    runs.append([])
                    size = 0
                runs[-1] += layer
                size += numel
            return runs

        def flat_grads(params: list[nn.Parameter], dtype: torch.dtype) -> torch.Tensor:
            flat = torch.zeros(sum(p.numel() for p in params), dtype=dtype, device=self.device)
            offset = 0
            for p in params:
                view = flat[offset : offset + p.numel()].view_as(p)
                owner[id(p)].grad = view
                if self.masters is not None:
                    _C.set_main_grad(p, view)
                offset += p.numel()
            return flat

        buckets: list[torch.Tensor] = []
        stage_buckets: dict[int, list[int]] = {}
        for s in self.stage_ids:
            by_dtype: dict[torch.dtype, list[list[nn.Parameter]]] = {}
            for layer in layers_last_first(self.stages[s]):
                for dtype in dict.fromkeys(owner[id(p)].dtype for p in layer):
                    by_dtype.setdefault(dtype, []).append([p for p in layer if owner[id(p)].dtype == dtype])
            stage_buckets[s] = []
            for dtype, layers in by_dtype.items():
                for run in split(layers, cap_bytes // dtype.itemsize):
                    stage_buckets[s].append(len(buckets))
                    buckets.append(flat_grads(run, dtype))
        return buckets, stage_buckets

    def _make_optimizer(self, name: str, lr: float) -> torch.optim.Optimizer:
        params = self.optimized or [nn.Parameter(torch.zeros(1, device=self.device))]
        if name == "sgd":
            return torch.optim.SGD(params, lr=lr)
        if name == "adam":
            return torch.optim.Adam(params, lr=lr)
        raise ValueError(f"unknown optimizer '{name}' (expected sgd or adam)")

    def _probe_specs(self, micro_input: torch.Tensor | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Shape and dtype of every stage's input and output, as meta tensors. Stage by stage, the owner
        runs its stage once on zeros (no grad) and tells the whole pipeline what came out."""
        pp_group = self.groups.pp
        specs: list[tuple[tuple[int, ...], torch.dtype] | None] = [None] * (self.num_stages + 1)
        first_owner = self.groups.pp_ranks[0]
        box = [(tuple(micro_input.shape), micro_input.dtype) if micro_input is not None else None]
        if self.pp_size > 1:
            dist.broadcast_object_list(box, src=first_owner, group=pp_group)
        specs[0] = box[0]
        for s in range(self.num_stages):
            owner = s % self.pp_size
            box = [None]
            if owner == self.pp_rank:
                shape, dtype = specs[s]
                with torch.no_grad():
                    out = self._runner(s, torch.zeros(shape, dtype=dtype, device=self.device))
                box = [(tuple(out.shape), out.dtype)]
            if self.pp_size > 1:
                dist.broadcast_object_list(box, src=self.groups.pp_ranks[owner], group=pp_group)
            specs[s + 1] = box[0]
        meta = [torch.empty(shape, dtype=dtype, device="meta") for shape, dtype in specs]
        return meta[:-1], meta[1:]

    def _build_executor(self, micro_input: torch.Tensor | None) -> _C.PipelineExecutor:
        inputs, outputs = self._probe_specs(micro_input)
        sends, recvs = {}, {}
        for (src, dst, kind), channel in self.groups.channels.items():
            code = 0 if kind == ACTIVATION else 1
            entry = (channel.group, channel.peer_group_rank)
            if src == self.pp_rank:
                sends[(dst, code)] = entry
            if dst == self.pp_rank:
                recvs[(src, code)] = entry
        dp_sync = _C.DpGradSync(self._buckets, self.groups.dp, self._dp_grad_dtype)
        # The chains the runner would run as linear_chain (2-D input) go to the executor instead.
        native = {s: (params, relu, self._recompute) for s, chain in self._native_chains.items()
                  if chain is not None and inputs[s].dim() == 2 for params, relu in [chain]}
        return _C.PipelineExecutor(
            actions=self.actions,
            pp_rank=self.pp_rank,
            pp_size=self.pp_size,
            num_stages=self.num_stages,
            num_micro=self.micro_batches,
            stage_fn=self._runner,
            # F.mse_loss runs inside C++ (no Python on the last stage's critical path); any other loss is called
            loss_fn="mse" if self.loss_fn is F.mse_loss else _micro_loss(self.loss_fn),
            send_channels=sends,
            recv_channels=recvs,
            input_specs=inputs,
            output_specs=outputs,
            device=str(self.device),
            dp_sync=dp_sync,
            stage_buckets=self._stage_buckets,
            merge_weight_grads=self._merge_weight_grads,
            record_trace=self._trace,
            overwrite_weight_grads=self._overwrite_grads,
            native_stages=native,
        )

    # ----------------------------------------------------------------------------------------- the step

    @property
    def holds_first_stage(self) -> bool:
        return 0 in self.stage_ids

    @property
    def holds_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stage_ids

    def zero_grad(self) -> None:
        for flat in self._buckets:
            flat.zero_()

    def inject_nonfinite_grad(self) -> None:
        """Test hook: the next step finds an inf in this rank's first gradient bucket after backward."""
        self._inject_nonfinite = True

    def train_step(self, inputs: MicroBatches, targets: MicroBatches) -> StepResult:
        """inputs/targets: this DP rank's slice of the global batch (inputs needed on the first stage,
        targets on the last; pass None elsewhere). Either may instead be a callable micro -> that micro-batch's
        rows of the slice: the executor then asks for each micro-batch when its forward runs, so the batch is
        never resident as a whole. Returns the global mean loss on every rank."""
        start = time.perf_counter()
        scale = self.scaler.scale if self.scaler is not None else 1.0
        # The loss of each micro-batch is divided by the micro-batch count and the DP size here, exactly once
        # (and multiplied by the fp16 loss scale): the DP all-reduce then sums to the mean with no extra pass
        # over the gradients. The executor returns the losses before this multiplier.
        losses = self._forward_backward(inputs, targets, scale / (self.micro_batches * self.dp_size))
        if self._inject_nonfinite and self._buckets:
            self._buckets[0].view(-1)[0] = float("inf")
        self._inject_nonfinite = False

        found_inf, skipped, grad_norm = self._update()
        loss = self._global_loss(losses)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if found_inf is not None:
            skipped = bool(found_inf.item())  # behind the syncs above: no extra wait
        if self.scaler is not None:
            self.scaler.update(skipped)
            self.overflow_watch.observe(self.scaler)
        return StepResult(loss=loss, step_time_s=time.perf_counter() - start, skipped=bool(skipped),
                          loss_scale=scale if self.scaler is not None else None, grad_norm=grad_norm)

    def _forward_backward(self, inputs: MicroBatches, targets: MicroBatches, multiplier: float) -> list:
        """Runs the step's pipeline program (building the executor on the first step); the gradients are then
        summed over DP. Returns the per-micro-batch losses on the last stage."""
        for needed, given, what in ((self.holds_first_stage, inputs, "inputs"),
                                    (self.holds_last_stage, targets, "targets")):
            if needed and given is None:
                raise ValueError(f"pipeline rank {self.pp_rank} holds the {'first' if what == 'inputs' else 'last'} "
                                 f"stage: train_step needs its {what}")
        half = self.precision.half_dtype if self.precision.half_weights else None
        if callable(inputs) or callable(targets):
            input_fn = _micro_batch_fn(inputs, self.micro_batches, half, "inputs") if self.holds_first_stage else None
            target_fn = (_micro_batch_fn(targets, self.micro_batches, None, "targets") if self.holds_last_stage
                         else None)
            self._prepare(input_fn(0) if input_fn and self._executor is None else None)
            return self._executor.run_streamed(input_fn, target_fn, multiplier)
        if self.holds_first_stage and half is not None:
            inputs = inputs.to(half)
        micro_in = list(inputs.chunk(self.micro_batches)) if self.holds_first_stage else []
        micro_tgt = list(targets.chunk(self.micro_batches)) if self.holds_last_stage else []
        self._prepare(micro_in[0] if micro_in else None)
        return self._executor.run(micro_in, micro_tgt, multiplier)

    def _prepare(self, first_micro_input: torch.Tensor | None) -> None:
        """The executor (first step: its shapes come from a micro-batch), and zeroed gradients unless this step
        overwrites them."""
        if self._executor is None:
            self._executor = self._build_executor(first_micro_input)
        if not self._executor.overwrites_weight_grads:
            self.zero_grad()

    def _update(self) -> tuple[torch.Tensor | None, bool, float | None]:
        """The optimizer's side of the step: (device overflow flag or None, skipped, grad norm or None).

        fp16 with half weights, plain SGD and no clipping: the overflow check only reads the gradients, and the
        fused step applies 1/scale itself and skips itself on the device, so the host reads the flag only at the
        step's own final sync (csrc/amp/nonfinite.h). The gradient buffers then still hold the SCALED gradients
        after the step: nothing reads them before the next step zeroes or overwrites them. Clipping (its norm
        needs unscaled gradients) and any other optimizer (it reads .grad) unscale in place, and decide on the
        host. DP replicas hold identical gradients after the all-reduce; agreeing over PP x MP makes every rank
        of every replica take the same decision."""
        fused_lr = (plain_sgd_lr(self.optimizer)
                    if self.scaler is not None and self.masters is not None and self.clip_grad <= 0 else None)
        if fused_lr is not None:
            found_inf = self.scaler.find_nonfinite(self._buckets, self.groups.model_parallel, self.device)
            self.masters.sgd_step_and_cast(fused_lr, inv_scale=self.scaler.inv_scale, skip_if=found_inf)
            return found_inf, False, None
        skipped = False
        if self.scaler is not None:
            skipped = self.scaler.unscale_and_check(self._buckets, self.groups.model_parallel, self.device)
        grad_norm = self._clip() if not skipped and self.clip_grad > 0 else None
        if not skipped:
            self._optimizer_step()
        return None, skipped, grad_norm

    def _optimizer_step(self) -> None:
        """The optimizer's step, then (half weights) the one cast of the masters to the model. Plain SGD on
        fp32 masters runs both as one fused pass (csrc/optim/sgd_cast.h); any other optimizer, or SGD with
        momentum, weight decay, nesterov or maximize, takes torch's step and a separate copy."""
        lr = plain_sgd_lr(self.optimizer) if self.masters is not None else None
        if lr is not None:
            self.masters.sgd_step_and_cast(lr)
            return
        self.optimizer.step()
        if self.masters is not None:
            self.masters.copy_to_model()

    def _clip(self) -> float:
        split = [o.grad for p, o in zip(self.parameters, self.optimized) if is_mp_split(p)]
        replicated = [o.grad for p, o in zip(self.parameters, self.optimized) if not is_mp_split(p)]
        return clip_grad_norm(split, replicated, self.clip_grad, self.groups.mp, self.groups.pp, self.device)

    def _global_loss(self, losses: list[torch.Tensor]) -> float:
        """Mean loss over the global batch, on every rank: one small all-reduce over the world in which only
        the last stage's MP rank 0 of each replica contributes."""
        contributes = self.holds_last_stage and self.groups.coords.mp == 0
        value = torch.stack(losses).mean() if (contributes and losses) else torch.zeros((), device=self.device)
        value = value.detach().to(torch.float64 if self.device.type == "cpu" else torch.float32).reshape(1)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(value)
        return float(value.item()) / self.dp_size

    def close(self) -> None:
        """Drop the executor (it holds process groups and buffers) and the fp32 main-grad routes; the engine
        cannot step afterwards."""
        self._executor = None
        if self.masters is not None:
            _C.clear_main_grads()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's layers as full tensors (gathered over MP) on the CPU, keyed like the whole model's
        state_dict ("<module index>.<name>"), whatever the grid. Every rank must call it (MP all-gathers)."""
        weights = dict(zip(map(id, self.parameters), self.optimized))  # fp32 masters when weights are half
        state: dict[str, torch.Tensor] = {}
        for s in self.stage_ids:
            for name, param in self.stages[s].named_parameters():
                local, _, leaf = name.partition(".")
                full = gather_full(weights[id(param)], self.groups.mp)
                state[f"{self.stage_layer_indices[s][int(local)]}.{leaf}"] = full.cpu()
        return state

    @property
    def trace(self) -> list:
        return list(self._executor.trace()) if self._executor is not None else []

    # ------------------------------------------------------------------ checkpoints (issue #7, hybrid_engine/checkpoint.py)
    def _checkpoint_tensors(self) -> list[tuple[str, nn.Parameter, torch.Tensor]]:
        """(global name, model parameter, the tensor the optimizer steps: the fp32 master with half weights)."""
        stepped = dict(zip(map(id, self.parameters), getattr(self, "optimized", self.parameters)))
        out = []
        for s in self.stage_ids:
            for name, param in self.stages[s].named_parameters():
                local, _, leaf = name.partition(".")
                out.append((f"{self.stage_layer_indices[s][int(local)]}.{leaf}", param, stepped[id(param)]))
        return out

    def checkpoint_names(self) -> list[str]:
        """Global names ("<module index>.<weight|bias>") of this rank's parameters."""
        return [name for name, _, _ in self._checkpoint_tensors()]

    def state_for_checkpoint(self) -> dict:
        """This rank's training state in a grid-independent form, on the CPU: "weights" and per-parameter
        "optimizer" state as full tensors (gathered over MP) keyed by global parameter name, and the loss
        scaler's state (None without one). Every rank must call it (MP all-gathers, in the same order)."""
        weights, optimizer = {}, {}
        for name, param, stepped in self._checkpoint_tensors():
            weights[name] = gather_full(stepped, self.groups.mp).cpu()
            optimizer[name] = {}
            for key, value in self.optimizer.state.get(stepped, {}).items():
                if torch.is_tensor(value) and value.shape == stepped.shape:  # a per-element state: a shard
                    alias = value.detach()
                    alias.mp_split, alias.mp_split_dim = getattr(param, "mp_split", False), getattr(
                        param, "mp_split_dim", None)
                    value = gather_full(alias, self.groups.mp)
                optimizer[name][key] = value.detach().cpu().clone() if torch.is_tensor(value) else value
        scaler = getattr(self, "scaler", None)
        return {"weights": weights, "optimizer": optimizer, "scaler": scaler.state_dict() if scaler else None}

    @torch.no_grad()
    def load_checkpoint_state(self, weights: dict, optimizer: dict, scaler: dict | None) -> None:
        """Inverse of state_for_checkpoint, on any grid: every full tensor of this rank's parameters is sliced
        to this rank's MP shard. No collectives. A scaler state is restored only if this run has a scaler."""
        for name, param, stepped in self._checkpoint_tensors():
            full = weights[name]
            stepped.copy_(take_shard(full, like=param, mp_group=self.groups.mp))
            if stepped is not param:
                param.copy_(stepped)  # half weights: the one cast, as after an optimizer step
            state = {}
            for key, value in optimizer.get(name, {}).items():
                if torch.is_tensor(value) and value.shape == full.shape and value.dim() > 0:
                    value = take_shard(value, like=param, mp_group=self.groups.mp).to(stepped.device)
                state[key] = value.clone() if torch.is_tensor(value) else value
            if state:
                self.optimizer.state[stepped] = state
            else:
                self.optimizer.state.pop(stepped, None)
        own_scaler = getattr(self, "scaler", None)
        if own_scaler is not None and scaler is not None:
            own_scaler.load_state_dict(scaler)
