"""What the planner knows of a device: a few rates and sizes, from a small table of datasheet-ish numbers (H100,
H200 SXM), a CPU estimate, or a quick measurement on the device itself (`calibrate`).

The numbers are what the engine's own kernels reach, not the datasheet peaks: experiments/results/2026-11-26-
2xH200.json measured an N=8192 fp16 GEMM at 457 TFLOP/s with M=128 rows and 764 with M=1024, a 4.2 TB/s HBM copy
and 394 GB/s between two GPUs; the GEMM's rate is modelled as gemm_flops * M / (M + gemm_rows_half).
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass

GIB = 2**30
# The causal attention core's rate over the GEMM rate (its FLOPs the causal half, models/planner_shape.py; the
# autograd stages' slowdown, step_time.AUTOGRAD_SLOWDOWN, on top): one SDPA call over the whole sequence, and
# block by block under context parallelism (parallel/context/block_attention.py: the rank's rows against one block
# of keys, half of each off-diagonal block), by the kernel that computes the blocks. Fitted on H200 to the
# Llama-1B shape (head dim 64): one GPU at 8k tokens for the one call (SDPA runs cuDNN's kernels there); cp 2 at
# 32k to 128k and cp 4 at 32k to 128k for the blocks: aten's flash kernel at about 0.56 of the one call's rate
# (experiments/results/2026-11-27-{2,4}xH200-long-seq.json), cuDNN's, the one call's own kernel, at 0.81 of it
# (2026-11-28-4xH200-long-seq.json; tests/planner/test_long_sequences.py). The two kernels' own ratio, measured
# alone on the blocks of cp 4 at 32k, is 1.6 (raw/2026-11-28-1xH200-attention-kernels.jsonl).
ATTENTION_EFFICIENCY = 0.8
BLOCK_ATTENTION_EFFICIENCY = {"cudnn": 0.65, "flash": 0.45}
# A flash kernel's backward recomputes the scores from Q and K before the four products of the gradients: five
# GEMM-shaped products against the forward's two, so 2.5 times the forward's FLOPs.
ATTENTION_BACKWARD = 2.5


@dataclass(frozen=True)
class Card:
    """One rank's device, as the cost and memory models see it."""

    name: str
    gemm_flops: float
    """Half-precision GEMM FLOP/s at many rows (fp32 GEMMs: fp32_flops)."""
    gemm_rows_half: float
    """A GEMM's rows (M) at which it runs at half of gemm_flops: small micro-batches run slower per FLOP."""
    fp32_flops: float
    hbm_bytes_s: float
    """Device memory bandwidth: what bounds the gradient accumulation, the update and the elementwise work."""
    p2p_bytes_s: float
    """One pipeline send between two ranks of a node."""
    allreduce_bytes_s: float
    """Bus bandwidth of an all-reduce within a node (time = 2 (n - 1) / n bytes / this)."""
    latency_s: float
    """The fixed cost of one message or collective."""
    action_overhead_s: float
    """The fixed cost of one layer's F, B, I or W (kernel launches, the executor's bookkeeping)."""
    memory_bytes: float
    """Memory a rank may use."""
    mp_sync_s: float = 0.0
    """What one MP all-reduce costs beyond its transfer, per other rank of the MP group: every rank waits for the
    slowest to reach it (its launches, its host work), so the wait grows with the group."""
    step_host_s: float = 0.0
    """The driver's fixed work a step whatever the plan (the data drawn, the loss scale checked, the step's
    bookkeeping): what a step of almost no GPU work still takes."""
    op_host_s: float = 0.0
    """The host's time to issue one aten operator of an eager autograd stage (Python, autograd's bookkeeping,
    dispatch, the launch): a layer's action takes at least its operators (LayerShape.host_ops) times this, however
    little GPU work they hold; 0: no such floor."""
    workspace_bytes: float = 0.0
    """What the device's libraries allocate through PyTorch's caching allocator on every rank, so that
    torch.cuda.max_memory_allocated counts it: cuBLAS's workspace, 32 MiB on Hopper (torch's default
    CUBLAS_WORKSPACE_CONFIG)."""
    search: bool = True
    """False: the planner keeps the reference plan (1f1b, 4 micro-batches) instead of ranking plans by time."""
    compute_scale: float = 1.0
    """The run's measured compute time over the table's (planner/refit.py): what the GEMMs, attention and
    elementwise work of every action are multiplied by."""
    host_action_s: float | None = None
    """The run's measured fixed cost of one layer's action (launches, the executor's and autograd's bookkeeping),
    replacing the table's estimate; None: the table's."""
    gpu: bool = True
    """A CUDA device (CUDA graphs); False: the host's CPU."""
    fp8_over_half: float = 0.0
    """The card's dense fp8 tensor-core peak over its half-precision one (its datasheet's): fp8 GEMMs run at
    gemm_flops times this, the share of the peak the half GEMMs reach; 0: no fp8 tensor cores (fp8_flops)."""
    sdpa_kernel: str = "flash"
    """The attention kernel torch's SDPA runs for a causal half-precision call on this card (cudnn on Hopper, seen on
    an H200: experiments/bench/attention_kernels_bench.py), which context parallelism's blocks run under
    --cp-kernel auto (parallel/context/block_attention.py pick_backend)."""

    def with_memory(self, nbytes: float) -> "Card":
        return dataclasses.replace(self, memory_bytes=nbytes)

    @property
    def fp8_flops(self) -> float:
        """fp8 GEMM FLOP/s at many rows (fp8/matmul.py); without fp8 tensor cores the emulation's fp32 GEMMs."""
        return self.gemm_flops * self.fp8_over_half if self.fp8_over_half else self.fp32_flops

    def gemm_s(self, flops: float, rows: float, weight_bytes: float, half: bool, fp8: bool = False) -> float:
        """One GEMM of `rows` rows against weights of `weight_bytes`: bounded by its FLOPs at the rate its rows
        allow (fp8: both operands in float8, the rows' effect as a half GEMM's), or by reading its weights."""
        peak = self.fp8_flops if fp8 else self.gemm_flops if half else self.fp32_flops
        rate = peak * rows / (rows + self.gemm_rows_half)
        return max(flops / rate, weight_bytes / self.hbm_bytes_s)

    def collective_s(self, nbytes: float, n: int, share: float = 2.0) -> float:
        """A collective over n ranks of `nbytes` each holds whole: share 2 an all-reduce, 1 an all-gather or a
        reduce-scatter (each rank moves (n - 1) / n of the whole once)."""
        return 0.0 if n <= 1 else self.latency_s + share * (n - 1) / n * nbytes / self.allreduce_bytes_s

    def hop_s(self, nbytes: float) -> float:
        """One send of `nbytes` to a neighbour (and its receive from the other)."""
        return self.latency_s + nbytes / self.p2p_bytes_s

    def blocks_kernel(self, asked: str) -> str:
        """The kernel of context parallelism's blocks under --cp-kernel `asked` (auto: the card's SDPA kernel)."""
        return self.sdpa_kernel if asked == "auto" else asked

    def attention_s(self, flops: float, half: bool, blocks: str | None = None) -> float:
        """The attention core's `flops` (scores and weighted sum, models/planner_shape.causal_attention_flops);
        blocks: the kernel that computes them block by block (context parallelism's ring and all-gather; a kernel
        of the CPU's at flash's rate), None: in one SDPA call."""
        efficiency = (ATTENTION_EFFICIENCY if blocks is None else
                      BLOCK_ATTENTION_EFFICIENCY.get(blocks, BLOCK_ATTENTION_EFFICIENCY["flash"]))
        return flops / (efficiency * (self.gemm_flops if half else self.fp32_flops))


# The host's terms of a GPU card, fitted on H200s (tests/planner/test_step_predictions.py, every measured step):
# the fixed work a step, from config C on one GPU (2026-11-27-1xH200-plan-one.json: 3.9-4.0 ms a step against 3.2
# of GPU work predicted, at any plan of one micro-batch); the MP synchronisation, from the GPT at tp4 with 8 and 2
# micro-batches (2026-11-27-4xH200-grids-gpt.json: 306 and 159 ms: the same bytes, four times the all-reduces), at
# tp2 (2026-11-27-2xH200-engine-ab-gpt-tp2.json: 284 ms) and config C at mp2 (grids-mlp: 2.8 ms). The same host
# drives an H100. The host's cost of one eager aten operator (step_time.host_floor), from the Llama-1B under tensor
# parallelism on 4 x H200, whose blocks run RMSNorm, RoPE and SwiGLU unfused there (80 operators forward, 120
# backward, 86 without the weight gradients: models/op_count.py) and whose steps its GPU work does not explain: the
# llama-4gpu pass's pp2 x tp2 (2026-11-27-4xH200-llama-4gpu.json: 1f1b 240.8 ms, zb1 + merged W 259.3) asks 15 us
# (+4.5%, -4.4%), the engine A/B's runs (2026-11-27-4xH200-engine-ab-llama.json: pp2 x tp2 266.4 and 288.1 ms, tp4
# 507.4) 17 us (-1.7%, -9.1%, +0.5%); 16 us, between the two, predicts all five within 15% (+10.9% to -14.1%).
HOST_TERMS = {"mp_sync_s": 40e-6, "step_host_s": 0.7e-3, "op_host_s": 16e-6}
# H100 and H200 SXM datasheets: tensor-core peaks of 3958 TFLOP/s in fp8 and 1979 in bf16 and fp16, each with
# sparsity (dense: half of each): fp8 GEMMs at twice the half rate.
HOPPER_FP8_OVER_HALF = 3958 / 1979
CARDS: dict[str, Card] = {
    # The H200's GH100 chip with less and slower HBM: the same GEMM peak, its GEMMs measured ~3.5% slower on the
    # GPT-1B shape (one GPU, 8 micro-batches: 410 ms on an H100, experiments/results/2026-11-26-2xH100-gpt-pp-tp.json,
    # against 396 on an H200, 2026-11-26-2xH200-gpt-dp.json).
    "h100": Card("H100", gemm_flops=770e12, gemm_rows_half=96, fp32_flops=48e12, hbm_bytes_s=2.9e12,
                 p2p_bytes_s=390e9, allreduce_bytes_s=350e9, latency_s=15e-6, action_overhead_s=6e-6,
                 memory_bytes=79.1 * GIB, workspace_bytes=32 * 2**20, fp8_over_half=HOPPER_FP8_OVER_HALF,
                 sdpa_kernel="cudnn", **HOST_TERMS),
    "h200": Card("H200", gemm_flops=800e12, gemm_rows_half=96, fp32_flops=51e12, hbm_bytes_s=4.2e12,
                 p2p_bytes_s=394e9, allreduce_bytes_s=360e9, latency_s=15e-6, action_overhead_s=6e-6,
                 memory_bytes=139.8 * GIB, workspace_bytes=32 * 2**20, fp8_over_half=HOPPER_FP8_OVER_HALF,
                 sdpa_kernel="cudnn", **HOST_TERMS),
    # A few cores through gloo: no GEMM rate worth ranking plans by (it depends on the threads and the machine's
    # other load), so the CPU keeps the reference plan and its predictions are rough.
    "cpu": Card("CPU", gemm_flops=50e9, gemm_rows_half=8, fp32_flops=50e9, hbm_bytes_s=10e9, p2p_bytes_s=1e9,
                allreduce_bytes_s=1e9, latency_s=50e-6, action_overhead_s=30e-6, memory_bytes=16 * GIB,
                search=False, gpu=False),
}
CARD_CHOICES = ("auto", *CARDS)


def card_named(name: str, device_name: str = "", total_memory: float | None = None) -> Card:
    """The table's card `name` ('auto': the one `device_name` names, e.g. 'NVIDIA H200'; an unknown GPU gets the
    H100's rates). total_memory: the device's own memory, which replaces the table's."""
    if name == "auto":
        name = next((key for key in ("h200", "h100") if key in device_name.lower()), "h100")
        if not device_name:
            name = "cpu"
    card = CARDS[name]
    if device_name and name != "cpu" and CARDS[name].name not in device_name:
        card = dataclasses.replace(card, name=f"{device_name} (as an {card.name})")
    return card.with_memory(total_memory) if total_memory else card


def names_a_gpu(name: str, device_type: str) -> bool:
    """Whether this_device(name, device_type) is a GPU's card, told without asking the device."""
    return name in ("h100", "h200") or (name == "auto" and device_type == "cuda")


def this_device(name: str, device_type: str) -> Card:
    """The card of this process's device: the same on every rank of a grid of like devices (nothing measured)."""
    if device_type == "cuda" and name in ("auto", "h100", "h200"):
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return card_named(name, props.name, props.total_memory)
    if name == "auto" or name == "cpu":
        from hybrid_engine.models.memory_estimate import memory_bytes

        return CARDS["cpu"].with_memory(memory_bytes("cpu") / max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    return CARDS[name]


def calibrate(base: Card, device: str = "cuda", size: int = 4096, repeats: int = 10) -> Card:
    """`base` with its GEMM and memory rates measured on this device (a few hundred milliseconds): a half GEMM of
    size x size x size and of 128 rows, and a copy. Per rank, so only the plan command uses it: ranks that measure
    differ, and a plan must be the same on every rank."""
    import torch

    dtype = torch.float16 if device == "cuda" else torch.float32

    def timed(fn) -> float:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / repeats

    a = torch.randn(size, size, device=device, dtype=dtype)
    few = torch.randn(128, size, device=device, dtype=dtype)
    big = timed(lambda: a @ a)
    small = timed(lambda: few @ a)
    rate = 2 * size**3 / big
    rate_128 = 2 * 128 * size**2 / small
    rows_half = max(1.0, 128 * (rate / max(rate_128, 1.0) - 1))
    src = torch.empty(64 << 20, device=device, dtype=torch.uint8)
    dst = torch.empty_like(src)
    copy = timed(lambda: dst.copy_(src))
    half = device == "cuda"
    return dataclasses.replace(base, name=f"{base.name} (calibrated)", gemm_flops=rate if half else base.gemm_flops,
                               fp32_flops=rate if not half else base.fp32_flops, gemm_rows_half=rows_half,
                               hbm_bytes_s=2 * src.numel() / copy)
