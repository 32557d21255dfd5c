"""ZeRO-3's parameters: each rank keeps only its piece of every bucket's flat parameter buffer; the whole buffer
exists only while the step needs it.

Between steps a bucket's buffer is released (csrc/grad/released_storage.h: the bytes freed, every parameter view
kept), and this rank's piece lives in a tensor of its own, which the optimizer's update writes. A step gathers
each bucket into its buffer (restore the bytes, copy the piece in, the in-place all-gather of
csrc/executor/dp_param_gather.h, traced like ZeRO-1's), bucket by bucket ahead of the forward: the first
`prefetch` buckets at the step's start, and as a layer starts, its own buckets (waited for) and the next `prefetch`
ones in forward order (launched, so they travel while that layer computes). A native stage's layers wait in C++ and
cannot launch anything, so its buckets are all launched at the step's start.

Without a pipeline, an autograd stage releases a bucket again once the last layer reading it has run its forward,
gathers it again just before that layer's backward (a hook on the layer's output gradient), launching the
`prefetch` buckets the backward reads next, and releases it once the backward has passed its first layer (a hook
on that layer's input gradient): between a layer's forward and its backward only its activations stay (FSDP's
reshard_after_forward and after backward). A forward inside the backward (recomputation) releases nothing after
it. Otherwise (a
pipeline, native or compiled stages) the buffers stay gathered from the step's first forward to its last backward:
a pipeline stage runs the forwards and backwards of m micro-batches interleaved with its neighbours', and gathering
around every micro-batch would move the parameters 2m times instead of once (torchtitan's reshard_after_forward=False
under PP). Every buffer is released after the step's backward.

Reading the parameters outside a step (evaluation, checkpoints of the model's tensors, the user's `engine.stages`)
gathers every bucket (`gather_all`); the next step releases them again (as its layers run, or after its
backward). A forward without gradients (the executor's shape probe, evaluation) releases each bucket after it.
"""
from __future__ import annotations

import torch
import torch.nn as nn

import hybrid_engine._C as _C


class ParamShards:
    """Per bucket: the flat buffer the parameters are views of, this rank's piece [start, end) of it as its own
    tensor, and whether the buffer is released, being gathered or whole."""

    RELEASED, GATHERING, WHOLE = "released", "gathering", "whole"

    def __init__(self, flats: list[torch.Tensor], ranges: list[tuple[int, int]], gather: _C.DpParamGather,
                 order: list[int], prefetch: int, launch_first: set[int] = frozenset()):
        self.flats, self.ranges, self.gather = flats, ranges, gather
        self.order, self.prefetch = order, prefetch
        self.position = {b: i for i, b in enumerate(order)}
        self.launch_first = launch_first  # buckets no Python hook can launch (native stages): at the step's start
        with torch.no_grad():
            self.pieces = [flat[s:e].clone() for flat, (s, e) in zip(flats, ranges)]
        self.state = [self.WHOLE] * len(flats)
        self.release_all()

    def launch(self, b: int) -> None:
        """Start gathering bucket b unless it is whole or on its way."""
        if self.state[b] != self.RELEASED:
            return
        flat, (start, end) = self.flats[b], self.ranges[b]
        _C.restore_storage(flat)
        # Written through an alias of the storage, not a view of the buffer: autograd's saved parameters (a forward
        # whose backward is still to come) must not see their version change.
        alias = torch.empty(0, dtype=flat.dtype, device=flat.device).set_(flat.untyped_storage(), start, (end - start,))
        with torch.no_grad():
            alias.copy_(self.pieces[b])
        self.gather.launch(b)  # a single-rank group launches nothing: the piece is the whole buffer
        self.state[b] = self.GATHERING

    def begin_step(self) -> None:
        for b in self.order[:self.prefetch]:
            self.launch(b)
        for b in sorted(self.launch_first):
            self.launch(b)

    def use(self, b: int, backward: bool = False) -> None:
        """Bucket b is needed now: gather it (waiting), and launch the next `prefetch` buckets of the forward (of
        the backward: the buckets before it)."""
        self.launch(b)
        at = self.position[b]
        if backward:
            ahead = self.order[max(0, at - self.prefetch):at][::-1]
        else:
            ahead = self.order[at + 1:at + 1 + self.prefetch]
        for next_b in ahead:
            self.launch(next_b)
        self.gather.wait(b)
        self.state[b] = self.WHOLE

    def reshard_after_forward(self, layers: list[nn.Module], buckets_of) -> None:
        """Hooks on an autograd stage's layers (forward order): after the forward of the last layer reading a
        bucket, release it and have the gradient of that layer's output gather it back; once the gradient of the
        first such layer's input is computed, the bucket's backward has read its parameters for the last time:
        release it again (only its gradient, in the gradient buffer, is still written)."""
        first: dict[int, int] = {}
        last: dict[int, int] = {}  # a layer whose parameters are read after its forward keeps them to its backward
        for i, layer in enumerate(layers):
            for b in buckets_of(layer):
                first.setdefault(b, i)
                last[b] = i
        for i, layer in enumerate(layers):
            starting = [b for b, at in first.items() if at == i]
            if starting:
                layer.register_forward_pre_hook(self._release_after_backward(starting))
            done = [b for b, at in last.items() if at == i]
            if done and not _read_after_forward(layer):
                layer.register_forward_hook(self._releaser(done))

    def _release(self, buckets: list[int]) -> None:
        for b in buckets:
            if self.state[b] == self.WHOLE:
                _C.release_storage(self.flats[b])
                self.state[b] = self.RELEASED

    def _release_after_backward(self, buckets: list[int]):
        def hook(module: nn.Module, args) -> None:
            if args and torch.is_tensor(args[0]) and args[0].requires_grad and torch.is_grad_enabled():
                args[0].register_hook(lambda grad: self._release(buckets))
        return hook

    def _releaser(self, buckets: list[int]):
        def release(module: nn.Module, args, output) -> None:
            if torch._C._current_graph_task_id() != -1:
                return  # a recomputation inside the backward: the backward right after reads them
            if torch.is_tensor(output) and output.requires_grad:
                output.register_hook(lambda grad: self._regather(buckets))
            elif torch.is_grad_enabled():
                return  # a graph this hook cannot see into may still read them: keep them
            self._release(buckets)  # (a forward without gradients: nothing reads them again)
        return release

    def _regather(self, buckets: list[int]) -> None:
        for b in buckets:
            self.use(b, backward=True)

    def gather_all(self) -> None:
        for b in self.order:
            self.launch(b)
        self.gather.wait_all()
        self.state = [self.WHOLE] * len(self.flats)

    def release_all(self) -> None:
        self.gather.wait_all()  # nothing may still write into a buffer about to be freed
        for b, flat in enumerate(self.flats):
            if self.state[b] != self.RELEASED and flat.numel() > 0:
                _C.release_storage(flat)
            self.state[b] = self.RELEASED

    def held_bytes(self) -> int:
        """Bytes of parameters this rank holds now: its pieces and whatever buffers are not released."""
        whole = sum(f.numel() * f.element_size() for f in self.flats if not _C.storage_released(f))
        return whole + sum(p.numel() * p.element_size() for p in self.pieces)


def _read_after_forward(layer: nn.Module) -> bool:
    """Whether something reads the layer's parameters after its forward, outside it (a module marked
    `parameters_read_after_forward`: an LM head whose logits the loss computes); its buckets then stay whole until
    its backward has passed."""
    return any(getattr(m, "parameters_read_after_forward", False) for m in layer.modules())


def describe(prefetch: int, pp_size: int, native: list[int], resharded: list[int]) -> str:
    """The announcement of how ZeRO-3 brings the parameters to the step (one line)."""
    ahead = f"{prefetch} bucket{'s' if prefetch > 1 else ''} ahead of the layer computing"
    if resharded:
        return (f"zero 3: parameters sharded; each bucket all-gathered ahead of the layers that read it ({ahead}), "
                "released after their forward, gathered again ahead of their backward and released after it (chosen "
                "because without a pipeline a micro-batch's backward follows its forward: only activations need to "
                "stay between them)")
    where = (f"; stage{'s' if len(native) > 1 else ''} {', '.join(map(str, native))} (native: layers wait in C++) "
             "gathered from the step's start" if native else "")
    why = ("a pipeline stage runs its micro-batches' forwards and backwards interleaved, and gathering per micro-batch "
           "would repeat the traffic m times" if pp_size > 1 else
           "native or compiled stages have no per-layer hooks to gather again for the backward")
    return (f"zero 3: parameters sharded; each bucket all-gathered ahead of the forward ({ahead}{where}), kept "
            f"gathered from the step's first forward to its last backward, then released (chosen because {why})")
