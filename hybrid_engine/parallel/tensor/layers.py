"""Tensor-parallel layers over the C++ core (Megatron-LM, Shoeybi et al. 2019, https://arxiv.org/abs/1909.08053).

An MLP's Linear layers pair up: a ColumnParallelLinear (weight split along output features, its input passing
through `copy_to_mp_region`, the paper's `f`) feeds, through an elementwise activation on shards, a
RowParallelLinear (weight split along input features, its partial outputs summed by `reduce_from_mp_region`, the
paper's `g`, bias added after the sum). One all-reduce per pair forward, one backward.

Sequence parallelism (`sequence_parallel`, Korthikanti et al. 2022, https://arxiv.org/abs/2205.05198): a
column-parallel layer all-gathers its input's sequence chunks instead of `f`, a row-parallel one reduce-scatters
its sum along the sequence instead of `g`, its bias (added to a chunk) then used through `copy_to_mp_region` so its
gradient is summed over MP. `input_in_region`: the input already entered the MP region (sequence_parallel.py's
ReplicatedNorm entering it once for several projections that read it, a block's q and kv or gate and up), so the
column-parallel layer is a local GEMM.

All layers compute through the C++ core's torch operators (ops.py): `Linear` through `ops.linear`, the parallel
ones through `ops.column_parallel_linear` / `ops.row_parallel_linear`, which hold their MP collective inside the layer's autograd
function, so the backward's input-gradient all-reduce runs under the weight gradient's GEMM (csrc/tp/parallel_linear.h).
A layer's `grad_buffer` (None until an Engine hands it its GradBuffer) decides where the weight gradient
goes: deferred for a zero-bubble W action while the buffer defers, or into an fp32 main grad for a half weight;
without one it is nn.Linear's, through autograd. Its `comm_trace` (an Engine's CommTrace under --trace)
records the MP collectives, labelled `trace_layer`.

Parameter placement. Every parameter these layers (and `parallelize_mlp`) create carries `param.mp_split`:
  True   this MP rank holds a slice; the full tensor is the concatenation of the group's slices.
  False  replicated: every rank of the MP group holds the same full tensor and, after backward, the same gradient.
A global gradient norm must sum the squares of split parameters over the MP group but count replicated ones
once, not MP times (`is_mp_split` reads the flag; parameters without it count as replicated).
A split parameter may also carry `param.mp_full_size`: the length of the full tensor along `mp_split_dim` when
it is shorter than the concatenation of the slices (a vocabulary padded to a multiple of mp: the padding rows
live in the last ranks' slices). `gather_full` drops the padding, `take_shard` pads with zeros, so checkpoints
hold the unpadded tensor whatever the grid. Copy placement between tensors with `copy_placement`.

Initial weights come from a dense nn.Linear through `from_dense`, sliced by the caller's rank in the MP group, so
they depend only on the dense model (and its seed), never on the grid.
"""
from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from hybrid_engine.parallel.tensor import ops

__all__ = [
    "Linear",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "parallelize_mlp",
    "is_mp_split",
    "gather_full",
    "take_shard",
    "copy_placement",
    "PLACEMENT_FLAGS",
    "ELEMENTWISE_MODULES",
]

# Modules that act elementwise, so they may sit between a column- and a row-parallel layer, on shards.
ELEMENTWISE_MODULES: tuple[type, ...] = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish, nn.Tanh,
    nn.Sigmoid, nn.Softplus, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.Identity, nn.Dropout,
)


def is_mp_split(param: torch.Tensor) -> bool:
    """True if `param` is this rank's slice of a tensor split over the MP group (see the module docstring)."""
    return bool(getattr(param, "mp_split", False))


def _rank_and_size(group: Optional[dist.ProcessGroup]) -> tuple[int, int]:
    if group is None:
        return 0, 1
    return group.rank(), group.size()


def _shard(total: int, parts: int, what: str, layer: str) -> int:
    if total % parts:
        raise ValueError(f"{layer}: {what} {total} is not divisible by the model-parallel size {parts}")
    return total // parts


def _mark(param: Optional[nn.Parameter], split: bool, dim: int = 0) -> None:
    """Record placement: `mp_split`, and for a split parameter the dimension it is split along."""
    if param is not None:
        param.mp_split = split
        param.mp_split_dim = dim if split else None


PLACEMENT_FLAGS = ("mp_split", "mp_split_dim", "mp_full_size")


def copy_placement(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """Give `dst` the placement flags of `src` (fp32 masters, optimizer-state aliases); returns `dst`."""
    for flag in PLACEMENT_FLAGS:
        if hasattr(src, flag):
            setattr(dst, flag, getattr(src, flag))
    return dst


def gather_full(param: torch.Tensor, mp_group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """The full tensor of a (possibly MP-split) parameter; every rank of the MP group must call this."""
    _, mp_size = _rank_and_size(mp_group)
    if not is_mp_split(param) or mp_size == 1:
        return param.detach().clone()
    parts = [torch.empty_like(param) for _ in range(mp_size)]
    dist.all_gather(parts, param.detach().contiguous(), group=mp_group)
    full = torch.cat(parts, dim=param.mp_split_dim)
    full_size = getattr(param, "mp_full_size", None)
    if full_size is not None and full_size < full.shape[param.mp_split_dim]:
        full = full.narrow(param.mp_split_dim, 0, full_size).contiguous()  # drop the padding rows
    return full


def take_shard(full: torch.Tensor, like: torch.Tensor, mp_group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """This rank's slice of `full`, placed like the parameter `like` (the inverse of gather_full)."""
    mp_rank, mp_size = _rank_and_size(mp_group)
    if not is_mp_split(like) or mp_size == 1:
        return full
    dim = like.mp_split_dim
    padded = like.shape[dim] * mp_size
    if full.shape[dim] < padded and getattr(like, "mp_full_size", None) == full.shape[dim]:
        pad = list(full.shape)
        pad[dim] = padded - full.shape[dim]
        full = torch.cat([full, full.new_zeros(pad)], dim=dim)  # padding rows start (and stay) zero
    return full.chunk(mp_size, dim=dim)[mp_rank]


def _dense_init(out_features: int, in_features: int, bias: bool, device, dtype) -> nn.Linear:
    """nn.Linear's own initialisation of the full layer, so a TP layer built directly equals its dense twin."""
    return nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype)


def _keep_meta_source(layer: nn.Module, dense: nn.Module) -> None:
    """A layer made from a dense one still on the meta device remembers it (outside the module tree: a tuple, not
    a sub-module) so that materializing the layer draws the dense layer's own initialisation (its seed)."""
    layer._dense_source = (dense,) if dense.weight.is_meta else None


def _dense_of(layer: nn.Module) -> nn.Module:
    """The full dense layer `layer` holds (a slice of): the one it was made from on meta, drawn on the layer's
    device (its own initialisation), else a fresh nn.Linear's."""
    source = getattr(layer, "_dense_source", None)
    if source is None:
        return _dense_init(layer.out_features, layer.in_features, layer.bias is not None, layer.weight.device,
                           layer.weight.dtype)
    dense = copy.deepcopy(source[0]).to_empty(device=layer.weight.device)
    dense.reset_parameters()
    return dense


class Linear(nn.Module):
    """nn.Linear through `ops.linear` (bit-identical forward and backward) with a deferrable weight gradient."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, device=None, dtype=None,
                 init: bool = True):
        super().__init__()
        self.grad_buffer = None  # the owning Engine's GradBuffer
        self.in_features, self.out_features = in_features, out_features
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        _mark(self.weight, False)
        _mark(self.bias, False)
        if init:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        dense = _dense_of(self)
        with torch.no_grad():
            self.weight.copy_(dense.weight)
            if self.bias is not None:
                self.bias.copy_(dense.bias)

    @classmethod
    def from_dense(cls, linear: nn.Linear, mp_group: Optional[dist.ProcessGroup] = None) -> "Linear":
        """A copy of `linear` (mp_group is accepted for symmetry with the parallel layers and ignored)."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype, init=False)
        with torch.no_grad():
            layer.weight.copy_(linear.weight)
            if layer.bias is not None:
                layer.bias.copy_(linear.bias)
        _keep_meta_source(layer, linear)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias, self.grad_buffer)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class ColumnParallelLinear(nn.Module):
    """Weight split along output features: this rank holds rows [r*out/p, (r+1)*out/p) of W and of b.

    The output is this rank's slice of the features unless `gather_output` (then all-gathered, full width).
    """

    def __init__(self, in_features: int, out_features: int, mp_group: Optional[dist.ProcessGroup],
                 bias: bool = True, gather_output: bool = False, *, sequence_parallel: bool = False,
                 input_in_region: bool = False, device=None, dtype=None, init: bool = True):
        super().__init__()
        self.grad_buffer = None  # the owning Engine's GradBuffer
        self.comm_trace, self.trace_layer = None, 0  # the owning Engine's CommTrace under --trace
        self.mp_group = mp_group
        self.mp_rank, self.mp_size = _rank_and_size(mp_group)
        self.in_features, self.out_features = in_features, out_features
        self.out_per_rank = _shard(out_features, self.mp_size, "out_features", type(self).__name__)
        self.gather_output = gather_output
        self.sequence_parallel = sequence_parallel and self.mp_size > 1
        self.input_in_region = input_in_region
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(self.out_per_rank, in_features, **factory))
        self.bias = nn.Parameter(torch.empty(self.out_per_rank, **factory)) if bias else None
        _mark(self.weight, self.mp_size > 1)
        _mark(self.bias, self.mp_size > 1)
        if init:
            self.reset_parameters()

    def _load_dense(self, linear: nn.Linear) -> None:
        rows = slice(self.mp_rank * self.out_per_rank, (self.mp_rank + 1) * self.out_per_rank)
        with torch.no_grad():
            self.weight.copy_(linear.weight[rows])
            if self.bias is not None:
                self.bias.copy_(linear.bias[rows])

    @classmethod
    def from_dense(cls, linear: nn.Linear, mp_group: Optional[dist.ProcessGroup], gather_output: bool = False,
                   **options) -> "ColumnParallelLinear":
        """This rank's rows of `linear` (any module with a full weight [out, in] and bias, e.g. an nn.Linear)."""
        layer = cls(linear.in_features, linear.out_features, mp_group, linear.bias is not None, gather_output,
                    device=linear.weight.device, dtype=linear.weight.dtype, init=False, **options)
        layer._load_dense(linear)
        _keep_meta_source(layer, linear)
        return layer

    def reset_parameters(self) -> None:
        self._load_dense(_dense_of(self))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_in_region:  # x entered the MP region once for every GEMM that reads it: a local GEMM
            return ops.linear(x, self.weight, self.bias, self.grad_buffer)
        if not self.gather_output:
            return ops.column_parallel_linear(x, self.weight, self.bias, self.grad_buffer, self.mp_group,
                                             self.sequence_parallel, self.comm_trace, self.trace_layer)
        x = ops.copy_to_mp_region(x, self.mp_group)
        y = ops.linear(x, self.weight, self.bias, self.grad_buffer)
        return ops.gather_from_mp_region(y, self.mp_group)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} ({self.out_per_rank} on rank "
                f"{self.mp_rank} of {self.mp_size}), bias={self.bias is not None}, gather_output={self.gather_output}, "
                f"sequence_parallel={self.sequence_parallel}, input_in_region={self.input_in_region}")


class RowParallelLinear(nn.Module):
    """Weight split along input features: this rank holds columns [r*in/p, (r+1)*in/p) of W; b is replicated.

    The input is this rank's slice of the features (a ColumnParallelLinear's output); the output is full width.
    """

    def __init__(self, in_features: int, out_features: int, mp_group: Optional[dist.ProcessGroup],
                 bias: bool = True, *, sequence_parallel: bool = False, device=None, dtype=None, init: bool = True):
        super().__init__()
        self.grad_buffer = None  # the owning Engine's GradBuffer
        self.comm_trace, self.trace_layer = None, 0  # the owning Engine's CommTrace under --trace
        self.mp_group = mp_group
        self.mp_rank, self.mp_size = _rank_and_size(mp_group)
        self.in_features, self.out_features = in_features, out_features
        self.in_per_rank = _shard(in_features, self.mp_size, "in_features", type(self).__name__)
        self.sequence_parallel = sequence_parallel and self.mp_size > 1
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, self.in_per_rank, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        _mark(self.weight, self.mp_size > 1, dim=1)
        _mark(self.bias, False)
        if self.bias is not None and self.sequence_parallel:
            self.bias.sequence_parallel = True  # added to a sequence chunk: its gradient summed over MP
        if init:
            self.reset_parameters()

    def _load_dense(self, linear: nn.Linear) -> None:
        cols = slice(self.mp_rank * self.in_per_rank, (self.mp_rank + 1) * self.in_per_rank)
        with torch.no_grad():
            self.weight.copy_(linear.weight[:, cols])
            if self.bias is not None:
                self.bias.copy_(linear.bias)

    @classmethod
    def from_dense(cls, linear: nn.Linear, mp_group: Optional[dist.ProcessGroup], **options) -> "RowParallelLinear":
        """This rank's columns of `linear` (any module with a full weight [out, in] and bias, e.g. an nn.Linear)."""
        layer = cls(linear.in_features, linear.out_features, mp_group, linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype, init=False, **options)
        layer._load_dense(linear)
        _keep_meta_source(layer, linear)
        return layer

    def reset_parameters(self) -> None:
        self._load_dense(_dense_of(self))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = ops.row_parallel_linear(x, self.weight, self.grad_buffer, self.mp_group, self.sequence_parallel,
                                   self.comm_trace, self.trace_layer)
        if self.bias is None:
            return y
        # After the sum, so the bias counts once, not MP times; on a sequence chunk its gradient is summed over MP.
        return y + (ops.copy_to_mp_region(self.bias, self.mp_group) if self.sequence_parallel else self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} ({self.in_per_rank} on rank {self.mp_rank} of {self.mp_size}), "
                f"out_features={self.out_features}, bias={self.bias is not None}, "
                f"sequence_parallel={self.sequence_parallel}")


def parallelize_mlp(seq: nn.Sequential, mp_group: Optional[dist.ProcessGroup]) -> nn.Sequential:
    """A new Sequential with `seq`'s nn.Linear layers replaced by tensor-parallel ones, same names and indices.

    Linear layers pair up in order, column-parallel then row-parallel; only elementwise modules may sit between
    the two of a pair (they run on shards). An odd trailing Linear becomes column-parallel with gather_output.
    With mp_group None or of size 1 every nn.Linear becomes `Linear` (deferrable weight gradients, no MP).
    Other modules are deep-copied; their parameters are marked replicated (mp_split = False).
    """
    _, mp_size = _rank_and_size(mp_group)
    children = list(seq._modules.items())  # not named_children(), which drops a module used twice (tied)
    linear_at = [i for i, (_, m) in enumerate(children) if isinstance(m, nn.Linear)]
    replaced: dict[int, nn.Module] = {}
    if mp_size == 1:
        replaced = {i: Linear.from_dense(children[i][1]) for i in linear_at}
    else:
        for k in range(0, len(linear_at) - 1, 2):
            col, row = linear_at[k], linear_at[k + 1]
            for name, module in children[col + 1:row]:
                if not isinstance(module, ELEMENTWISE_MODULES):
                    raise ValueError(
                        f"parallelize_mlp: module '{name}' ({type(module).__name__}) sits between the column-parallel "
                        f"layer '{children[col][0]}' and the row-parallel layer '{children[row][0]}', but only "
                        f"elementwise modules can run on feature shards")
            replaced[col] = ColumnParallelLinear.from_dense(children[col][1], mp_group)
            replaced[row] = RowParallelLinear.from_dense(children[row][1], mp_group)
            replaced[col].trace_layer, replaced[row].trace_layer = col, row
        if len(linear_at) % 2:
            last = linear_at[-1]
            replaced[last] = ColumnParallelLinear.from_dense(children[last][1], mp_group, gather_output=True)

    modules: "OrderedDict[str, nn.Module]" = OrderedDict()
    memo: dict = {}  # one deepcopy memo for the whole stage: a module used twice (tied weights) stays one module
    for i, (name, module) in enumerate(children):
        if i in replaced:
            modules[name] = replaced[i]
        else:
            module = copy.deepcopy(module, memo)
            for param in module.parameters():
                _mark(param, False)
            modules[name] = module
    return nn.Sequential(modules)
