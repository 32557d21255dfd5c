"""The torchtitan peer: what a torchtitan (PyPI torchtitan==0.3.0) user trains an 8B-class Llama with -- its own
Llama-3 model (Llama3Model built on the meta device and initialised shard by shard by its init_weights, flex attention
over per-document positions), its own parallelize_llama (FSDP2 with every rank in the data-parallel shard mesh, bf16
parameters and fp32 reductions by its default mixed precision, its per-block torch.compile with --compile, its full
activation checkpointing with --recompute), the chunked cross-entropy loss its Llama-3 8B recipe sets, its AdamW
container (fp32 masters, sharded), its gradient clipping, and its training step: each micro-batch's loss summed over
tokens and divided by the global token count, gradients accumulated over the micro-batches with FSDP's own division
turned off, the forward-backward captured as a CUDA graph (its default). Random tokens, one document a sequence.
Run under torchrun, one process a GPU. One JSON line from rank 0 with the keys of fsdp2_hf_llama.py: tokens/s, MFU
(6N + 12 L s d per token over 989 TFLOP/s, N every parameter as the FSDP2 peer counts it), peak GiB per GPU.

What torch decides (each printed once by the run):
- torchtitan 0.3.0's default parallelism backend, spmd_types, hands FSDP plain tensors carrying SPMD annotations,
  which fully_shard refuses up to torch 2.13 ("When dp_mesh_dims is provided, all parameters must be DTensors");
  its partial_dtensor backend (DTensors for the model-parallel axes only, FSDP2 as before) is the default here.
- torch older than torchtitan 0.3.0 (no torch.distributed.fsdp.DataParallelMeshDims, e.g. 2.11) cannot import it:
  torchtitan.distributed.fsdp names that class at import. The class is used only by the spmd_types and full_dtensor
  backends, so a stand-in name lets the partial_dtensor backend import and run; on such a torch the chunked loss's
  backward fails inside FSDP ("The tensor has a non-zero number of elements, but its data is not allocated yet": the
  final norm shares the head's FSDP unit, which the chunked loss reshards after its chunks' backward, and this FSDP
  does not gather it again for the norm's backward; with the norm in a unit of its own the chunked loss runs), so
  torchtitan's plain cross-entropy loss is taken instead (the same losses; the whole logits held at once).
- torchtitan 0.3.0's flex attention builds its block mask with create_block_mask(..., separate_full_blocks=...),
  which torch 2.11's flex attention does not take (a TypeError at the first forward); on such a torch torchtitan's
  own causal SDPA attention (its "sdpa" backend: cuDNN / flash kernels, the same function for one document a
  sequence) stands in, and the run says so.
- --cpu (gloo smoke test): flex attention has no CPU backward, so torchtitan's causal SDPA stands in; gloo has no
  PREMUL_SUM, so FSDP reduces with a plain sum (the same numbers under torchtitan's divide factor of 1)."""
import argparse, dataclasses, json, os, statistics, sys, tempfile, time

import torch, torch.distributed as dist
import torch.distributed.fsdp as torch_fsdp

LOG = "torchtitan_llama:"
BACKENDS = ("partial_dtensor", "spmd_types", "full_dtensor")
p = argparse.ArgumentParser()
for k, v in dict(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, seq=4096, vocab=128256, batch=16,
                 micro=4, steps=7, warmup=3).items():
    p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
p.add_argument("--compile", action="store_true", help="torchtitan's per-block torch.compile (and of its loss)")
p.add_argument("--recompute", action="store_true", help="torchtitan's full activation checkpointing of every block")
p.add_argument("--no-cuda-graphs", action="store_true",
               help="run the forward-backward eagerly instead of torchtitan's default CUDA-graph capture")
p.add_argument("--spmd-backend", choices=BACKENDS, default=BACKENDS[0],
               help="torchtitan's parallelism.spmd_backend (its own default, spmd_types, needs torch newer than 2.13)")
p.add_argument("--cpu", action="store_true", help="gloo smoke test of the script itself")
a = p.parse_args()
world = int(os.environ.get("WORLD_SIZE", "1"))
TITANS_TORCH = hasattr(torch_fsdp, "DataParallelMeshDims")  # the FSDP API torchtitan 0.3.0 is written against
CHUNKS = 8  # torchtitan's ChunkedLossWrapper.Config().num_chunks, checked against it after the import


def refuse(msg):
    print(f"{LOG} {msg}", flush=True)
    sys.exit(2)


for name in ("hidden", "layers", "heads", "kv_heads", "ffn", "seq", "vocab", "batch", "micro", "steps"):
    if getattr(a, name) < 1:
        refuse(f"--{name.replace('_', '-')} must be at least 1, got {getattr(a, name)}")
if a.hidden % a.heads or a.heads % a.kv_heads or (a.hidden // a.heads) % 2:
    refuse(f"--hidden {a.hidden} must split into --heads {a.heads} even-sized heads, shared by --kv-heads {a.kv_heads}")
if a.batch % (world * a.micro):
    refuse(f"--batch {a.batch} must split into {world} ranks x --micro {a.micro} micro-batches")
if not 0 <= a.warmup < a.steps:
    refuse(f"--warmup {a.warmup} must leave at least one of --steps {a.steps} timed")
if TITANS_TORCH and a.seq % CHUNKS:
    refuse(f"--seq {a.seq} must split into the chunked loss's {CHUNKS} chunks")
if not TITANS_TORCH and a.spmd_backend != "partial_dtensor":
    refuse(f"--spmd-backend {a.spmd_backend} needs torch.distributed.fsdp.DataParallelMeshDims, "
           f"which torch {torch.__version__} lacks; only partial_dtensor runs on it")
if not TITANS_TORCH:  # named at import by torchtitan.distributed.fsdp; used by the other two backends only

    @dataclasses.dataclass
    class DataParallelMeshDims:
        shard: object = None
        replicate: object = None

    torch_fsdp.DataParallelMeshDims = DataParallelMeshDims

try:  # torchtitan's own modules, no more: its trainer module pulls in datasets, tensorboard and wandb
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss, IGNORE_INDEX
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims, parallel_dims as titan_parallel_dims, utils as dist_utils
    from torchtitan.distributed.activation_checkpoint import FullAC
    from torchtitan.distributed.cudagraph import wrap_with_cuda_graph
    from torchtitan.distributed.spmd_types import annotate_input_spmd_types
    from torchtitan.models import llama3 as titan_llama3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3.sharding import set_llama3_sharding_config
    from torchtitan.tools import utils as titan_utils
    import spmd_types  # torchtitan's own dependency, for the trainer's no_typecheck around the backward
except ImportError as e:
    refuse(f"torchtitan cannot be imported under torch {torch.__version__}: {type(e).__name__}: {e}")
assert ChunkedLossWrapper.Config().num_chunks == CHUNKS, "torchtitan's chunk count moved: update CHUNKS"


def llama3_config(hidden, layers, heads, kv_heads, ffn, vocab, seq):
    """torchtitan's Llama-3 8B flavour (its inits, fused qkv, flex attention, llama-scaled RoPE of theta 5e5) at any
    shape, its RoPE table sized to the training sequence as its trainer resizes it."""
    return titan_llama3.Llama3Model.Config(
        dim=hidden, vocab_size=vocab,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=hidden,
                                        param_init=titan_llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=hidden, param_init=titan_llama3._NORM_INIT),
        lm_head=Linear.Config(in_features=hidden, out_features=vocab,
                              param_init=titan_llama3._output_linear_init(hidden)),
        layers=titan_llama3._build_llama3_layers(
            fuse_qkv=True, n_layers=layers, dim=hidden, n_heads=heads, n_kv_heads=kv_heads, hidden_dim=ffn,
            rope=ComplexRoPE.Config(dim=hidden // heads, max_seq_len=seq, theta=500000, scaling="llama"),
            attn_backend="flex"))


def flex_takes_torchtitans_masks() -> bool:
    """Whether this torch's create_block_mask has the argument torchtitan 0.3.0 passes it."""
    import inspect
    from torch.nn.attention.flex_attention import create_block_mask
    return "separate_full_blocks" in inspect.signature(create_block_mask).parameters


sdpa = a.cpu or not flex_takes_torchtitans_masks()
ATTENTION_SAID = {(True, True): "causal SDPA (no flex backward on the CPU)", (False, False): "flex attention",
                  (False, True): "causal SDPA (this torch has no create_block_mask(separate_full_blocks=...), "
                                 "which its flex attention calls)"}
parallelism = ParallelismConfig(spmd_backend=a.spmd_backend)
training = TrainingConfig(local_batch_size=a.batch // world // a.micro, global_batch_size=a.batch, seq_len=a.seq,
                          disable_cuda_graphs=a.cpu or a.no_cuda_graphs)
compile_config = CompileConfig(enable=a.compile)
cuda_graphs = not training.disable_cuda_graphs
chunked_loss = TITANS_TORCH

dist.init_process_group("gloo" if a.cpu else "nccl"); rank = dist.get_rank()
DEV = torch.device("cpu") if a.cpu else torch.device("cuda", int(os.environ["LOCAL_RANK"]))
if not a.cpu:
    torch.cuda.set_device(DEV)
if rank == 0:
    print(f"{LOG} torch {torch.__version__}: spmd_backend {parallelism.spmd_backend}, FSDP over {world} ranks, "
          f"{a.micro} micro-batches of {training.local_batch_size}, "
          f"{'chunked' if chunked_loss else 'plain (this torch fails the chunked one)'} cross-entropy, "
          f"CUDA graphs {'on' if cuda_graphs else 'off'}, "
          f"{ATTENTION_SAID[a.cpu, sdpa]}", flush=True)
if a.cpu:  # torchtitan picks "cuda" when it finds no accelerator; its meshes go on the CPU for the smoke test
    titan_parallel_dims.device_type = "cpu"
dims = ParallelDims(dp_replicate=1, dp_shard=-1, cp=1, tp=1, pp=1, ep=1, world_size=world,
                    spmd_backend=parallelism.spmd_backend)
dims.build_mesh()
dist_utils.set_spmd_backend(parallelism.spmd_backend)
torch.manual_seed(0)

cfg = llama3_config(a.hidden, a.layers, a.heads, a.kv_heads, a.ffn, a.vocab, a.seq)
if sdpa:
    for layer in cfg.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
set_llama3_sharding_config(cfg, enable_sp=parallelism.enable_sequence_parallel)  # as its update_from_config does
with torch.device("meta"), titan_utils.set_default_dtype(torch.float32):
    model = cfg.build()
n_params = sum(x.numel() for x in model.parameters())  # every parameter, embedding and head, as the FSDP2 peer counts
with tempfile.TemporaryDirectory() as dump:
    model = titan_llama3.parallelize_llama(model, parallel_dims=dims, training=training, parallelism=parallelism,
                                           compile_config=compile_config,
                                           ac_config=FullAC.Config() if a.recompute else None, dump_folder=dump)
if a.cpu:
    for module in model.modules():
        if isinstance(module, torch_fsdp.FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
model.to_empty(device=DEV)
with torch.no_grad():
    model.init_weights(buffer_device=None)
model.train()

cross_entropy = CrossEntropyLoss.Config(global_vocab_size=a.vocab)
if chunked_loss:
    loss_fn = ChunkedLossWrapper.Config(loss_fn=cross_entropy).build(compile_config=compile_config)
    loss_fn.set_lm_head(model.lm_head)
    model._skip_lm_head = True  # the chunked loss applies the head chunk by chunk, as torchtitan's trainer arranges
else:
    loss_fn = cross_entropy.build(compile_config=compile_config)
optimizers = default_adamw(lr=3e-4).build(model_parts=[model])  # its Llama-3 8B recipe's optimizer
train_context = dist_utils.get_spmd_context(parallel_dims=dims, spmd_typechecking=False)
batch_mesh = dims.get_mesh("batch") if dims.dp_enabled else None  # no data-parallel mesh on one rank


def forward_backward(inputs, labels, global_valid_tokens, extra_kwargs):
    """torchtitan's forward-backward body: the micro-batch's token loss sum over the global token count."""
    with train_context():
        pred = model(inputs, **extra_kwargs)
        loss, _ = loss_fn(pred, labels, global_valid_tokens, positions=extra_kwargs["positions"])
        del pred
        with spmd_types.no_typecheck():  # as its trainer: types are checked on the forward only
            loss.backward()
    return loss


fwd_bwd = wrap_with_cuda_graph(forward_backward) if cuda_graphs else forward_backward
gc_handler = titan_utils.GarbageCollection(gc_freq=training.gc_freq)
mbs = training.local_batch_size
g = torch.Generator(device=DEV).manual_seed(1 + rank)
positions = torch.arange(a.seq, device=DEV).expand(mbs, a.seq).contiguous()  # one document a sequence
params = list(model.parameters())
sync = (lambda: None) if a.cpu else torch.cuda.synchronize
times, step_losses = [], []
for s in range(a.steps):
    gc_handler.run(s + 1)
    sync(); t = time.perf_counter()
    optimizers.zero_grad(set_to_none=training.disable_cuda_graphs)
    batches = [torch.randint(0, a.vocab, (mbs, a.seq + 1), device=DEV, generator=g) for _ in range(a.micro)]
    local_valid = sum((ids[:, 1:] != IGNORE_INDEX).sum() for ids in batches)
    global_valid = local_valid if batch_mesh is None else dist_utils.dist_sum_tensor(local_valid, batch_mesh)
    total = None
    for ids in batches:
        inputs, labels, extra = ids[:, :-1], ids[:, 1:], {"positions": positions}
        if not sdpa:  # the flex block mask from the positions, as its trainer builds it
            extra["attention_masks"] = model.get_attention_masks(positions=positions)
        if parallelism.spmd_backend == "spmd_types":
            inputs, labels, extra = annotate_input_spmd_types(dims, inputs, labels, extra)
        loss = fwd_bwd(inputs, labels, global_valid, extra).detach()
        total = loss.clone() if total is None else total.add_(loss)  # a graph's replay overwrites its output
    dist_utils.clip_grad_norm_(params, training.max_norm, foreach=True, pp_mesh=None, ep_enabled=False)
    optimizers.step()
    sync(); times.append(time.perf_counter() - t); step_losses.append(total)
losses = torch.stack(step_losses).float()
dist.all_reduce(losses)  # each rank holds its token-loss sum over the global token count: the sum is the mean
med = statistics.median(times[a.warmup:]); tok = a.batch * a.seq / med
flops = 6 * n_params + 12 * a.layers * a.seq * a.hidden
peak = torch.tensor([0.0 if a.cpu else torch.cuda.max_memory_allocated() / 2**30], device=DEV)
dist.all_reduce(peak, op=dist.ReduceOp.MAX)
if rank == 0:
    suffix = ("-compile" if a.compile else "") + ("-recompute" if a.recompute else "") \
        + ("" if cuda_graphs or a.cpu else "-nocudagraphs") + ("" if chunked_loss else "-plainloss") \
        + ("-sdpa" if sdpa and not a.cpu else "")
    print(json.dumps({"peer": "torchtitan-llama3" + suffix, "world": world, "params": n_params,
                      "step_ms": round(med * 1e3, 1), "tokens_s": round(tok),
                      "mfu": round(tok / world * flops / 989e12, 4), "peak_gib": round(float(peak), 2),
                      "losses": [round(float(x), 4) for x in losses],
                      "card": "cpu" if a.cpu else torch.cuda.get_device_name(),
                      "spmd_backend": parallelism.spmd_backend, "torch": torch.__version__}), flush=True)
dist.destroy_process_group()
