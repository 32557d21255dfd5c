"""The FSDP2 peer (the anchors' script, in the tree so that a device call carries it): what a team without this engine trains an 8B-class Llama with today -- Hugging Face transformers'
LlamaForCausalLM (SDPA) under torch FSDP2 (fully_shard per decoder layer, then the root; bf16 params for compute,
fp32 gradient reduction, fp32 masters sharded), fused AdamW, optional torch.compile of each decoder layer (as
torchtitan does), gradient accumulation over micro-batches, random tokens. Run under torchrun, one process a GPU.
One JSON line from rank 0: tokens/s, MFU (6N + 12 L s d per token over 989 TFLOP/s), peak GiB per GPU."""
import argparse, json, os, statistics, time
import torch, torch.distributed as dist, transformers as T
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy

p = argparse.ArgumentParser()
for k, v in dict(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, seq=4096, vocab=128256, batch=16,
                 micro=4, steps=7, warmup=3).items():
    p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
p.add_argument("--compile", action="store_true")
p.add_argument("--recompute", action="store_true")
p.add_argument("--cpu", action="store_true", help="gloo smoke test of the script itself")
a = p.parse_args()
dist.init_process_group("gloo" if a.cpu else "nccl"); rank, world = dist.get_rank(), dist.get_world_size()
DEV = "cpu" if a.cpu else "cuda"
if not a.cpu:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
torch.manual_seed(0)
cfg = T.LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
                    num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, max_position_embeddings=a.seq,
                    tie_word_embeddings=False, attn_implementation="sdpa")
with torch.device("meta"):
    m = T.LlamaForCausalLM(cfg)
if a.recompute:
    m.gradient_checkpointing_enable()
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for i, layer in enumerate(m.model.layers):
    if a.compile:
        layer.compile()
    fully_shard(layer, mp_policy=mp)
fully_shard(m, mp_policy=mp)
m.to_empty(device=DEV)
with torch.no_grad():
    for n, x in m.named_parameters():
        (x.normal_(0, 0.02) if x.dim() >= 2 else x.fill_(1.0))
    fresh = type(m.model.rotary_emb)(cfg)  # its buffers were lost on the meta device: rebuild them
    for name, buf in fresh.named_buffers():
        getattr(m.model.rotary_emb, name).copy_(buf)
m.train()
n_params = sum(x.numel() for x in m.parameters())  # DTensor numel is the global size
dec = [x for x in m.parameters() if x.dim() >= 2]; nod = [x for x in m.parameters() if x.dim() < 2]
opt = torch.optim.AdamW([{"params": dec, "weight_decay": 0.1}, {"params": nod, "weight_decay": 0.0}], lr=3e-4,
                        betas=(0.9, 0.95), fused=not a.cpu)
per_rank = a.batch // world; mbs = per_rank // a.micro
g = torch.Generator(device=DEV).manual_seed(1 + rank)
times, losses = [], []
sync = (lambda: None) if a.cpu else torch.cuda.synchronize
for s in range(a.steps):
    sync(); t = time.perf_counter(); tot = torch.zeros((), device=DEV)
    for _ in range(a.micro):
        ids = torch.randint(0, a.vocab, (mbs, a.seq), device=DEV, generator=g)
        loss = m(input_ids=ids, labels=ids).loss / a.micro; loss.backward(); tot += loss.detach()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); opt.zero_grad(set_to_none=True)
    sync(); times.append(time.perf_counter() - t); losses.append(float(tot))
med = statistics.median(times[a.warmup:]); tok = a.batch * a.seq / med
flops = 6 * n_params + 12 * a.layers * a.seq * a.hidden
peak = torch.tensor([0.0 if a.cpu else torch.cuda.max_memory_allocated() / 2**30], device=DEV); dist.all_reduce(peak, op=dist.ReduceOp.MAX)
if rank == 0:
    print(json.dumps({"peer": "hf-llama-fsdp2" + ("-compile" if a.compile else "") + ("-recompute" if a.recompute else ""),
                      "world": world, "params": n_params, "step_ms": round(med * 1e3, 1), "tokens_s": round(tok),
                      "mfu": round(tok / world * flops / 989e12, 4), "peak_gib": round(float(peak), 2),
                      "losses": [round(x, 4) for x in losses], "card": "cpu" if a.cpu else torch.cuda.get_device_name()}), flush=True)
dist.destroy_process_group()
