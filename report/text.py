"""The report's prose. Every number is read from the results (or computed by the schedule simulator at build
time); a sentence whose runs are missing says so instead of being printed with a number."""
from __future__ import annotations

import statistics
from typing import Optional

from .data import NOT_MEASURED, Bench, Convergence, MaxBatch, Results, Trace, finite, ok
from .figures import trace_parts
from .render import Block
from .tables import rel, same_source, times

BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def run(bench: Bench, **fields) -> Optional[dict]:
    r = bench.find(**fields)
    return r if r is not None and ok(r) else None


def cite(bench: Bench, r: dict) -> str:
    return f"#{bench.index(r)}"


def speedup(a: dict, b: dict) -> str:
    """'1.23x' for a over b when measured in one job, else a note that they are not compared."""
    return times(a["samples_s"] / b["samples_s"]) if same_source(a, b) else "different jobs, not compared"


def trace_of(bench: Bench, config: str, prec: str) -> Optional[Trace]:
    return next((t for t in bench.traces if trace_parts(t).get("config") == config
                 and trace_parts(t).get("prec") == prec), None)


def durations(trace: Trace, kind: str) -> float:
    """Median duration (ms) of one action type over all ranks of a trace."""
    return statistics.median(b[4] - b[3] for row in trace.rows for b in row if b[0] == kind)


def overlap(bench: Optional[Bench], bubbles2: dict[str, float], bubbles4: dict[str, float]) -> list[Block]:
    b2 = ", ".join(f"{k} {v:.3f}" for k, v in bubbles2.items())
    b4 = ", ".join(f"{k} {v:.3f}" for k, v in bubbles4.items())
    blocks: list[Block] = [
        ("p", "The Practical 10 base code runs the micro-batches stop-and-wait: stage 1 idles while stage 0 computes "
              "and the other way round (the 'naive' schedule below). The engine replaces this loop with a schedule "
              "that is data and an executor that overlaps computation with communication."),
        ("h", "Schedules are data"),
        ("b", "Each pipeline rank receives a list of actions such as 0F3 (stage 0, forward, micro-batch 3), B, I "
              "(input-gradient backward), W (weight-gradient backward), SEND_F/RECV_F/SEND_B/RECV_B. The C++ core "
              "generates the compute order (naive, gpipe, 1f1b, interleaved, zb1), then a lowering pass inserts each "
              "send right after the action producing the tensor and each receive one compute action ahead of its "
              "consumer, so the transfer runs while that action computes."),
        ("b", "Before anything runs, hybrid_engine.parallel.pipeline.schedule.simulate dry-runs all ranks together: it rejects a "
              "schedule that would deadlock and gives its bubble (idle share of the makespan) and peak activations. "
              "The figures below are that simulator, with F = 1, B = 2, I = W = 1 time unit per rank."),
        ("h", "The executor overlaps communication"),
        ("b", "Every (sender, receiver, kind) pair has its own two-rank process group (a channel), so activations "
              "going down and gradients going up never queue behind each other and each channel is FIFO."),
        ("b", "RECV actions post an asynchronous irecv early; the compute action that consumes the tensor waits on "
              "that one request only when it starts. SEND actions are isend calls whose completion is only checked "
              "at the end of the step: a GPU never stops computing to wait for its neighbour to receive."),
        ("b", "1F1B (warm-up forwards, then one forward / one backward alternating, then cool-down backwards) keeps "
              "at most pp micro-batches of activations alive instead of all m (GPipe), with the same bubble "
              "(pp-1)/(m+pp-1). Interleaved puts v=2 model chunks on each rank and divides the bubble by about v "
              "for more messages. zb1 (Qi et al., Zero Bubble Pipeline Parallelism, 2023) splits the backward into "
              "I, which is on the critical path and is sent upstream at once, and W, which has no consumer and "
              "is deferred into the idle slots; with --merge-wgrad all deferred W of a stage run as one "
              "weight-gradient GEMM per layer over every micro-batch's rows."),
        ("b", "--lookahead K lets every rank but the last run K forwards beyond 1F1B's warm-up. A gradient's round "
              "trip (send, the later stages' forward and backward, send back, the host's launches) otherwise "
              "leaves rank 0 waiting once per micro-batch; each extra forward covers a forward and a backward of "
              "that trip for one more micro-batch of activations (the simulator shows no change without latency "
              "and a shorter step with it)."),
        ("b", "Data-parallel gradients live in flat fp32 buckets of whole layers, last layer first; the fused chain "
              "and the merged weight-gradient flush announce each gradient's last write, and a bucket's all-reduce "
              "starts as soon as all of it is final, waited for once at the end of the step. 1/dp is folded into "
              "the loss, so the summed all-reduce is already the mean."),
        ("b", "With half weights and plain SGD, one CUDA kernel steps each fp32 master and writes its half copy in "
              "the same pass (14 bytes per parameter instead of 18 for torch's SGD followed by a copy)."),
        ("h", "Simulated bubbles (computed at build time)"),
        ("p", f"pp=2, m=8: {b2}. pp=4, m=8: {b4}."),
    ]
    if bench is None:
        return blocks
    peer = run(bench, system="peer", mode="1f1b", config="L", prec="fp16", dp=1, pp=2, mp=1)
    eng = run(bench, system="engine", mode="1f1b", config="L", prec="fp16", dp=1, pp=2, mp=1)
    zb1 = run(bench, system="engine", mode="zb1", config="L", prec="fp16", dp=1, pp=2, mp=1)
    if peer and eng and zb1:
        blocks += [("h", f"Measured ({bench.card}, config L, fp16)"),
                   ("p", f"The peer's 1F1B (torch.distributed.pipelining) reaches {peer['samples_s']:,.0f} samples/s "
                         f"({cite(bench, peer)}), the engine's 1F1B {eng['samples_s']:,.0f} "
                         f"({speedup(eng, peer)}, {cite(bench, eng)}) and its zb1 with merged "
                         f"weight gradients {zb1['samples_s']:,.0f} ({speedup(zb1, peer)}, "
                         f"{cite(bench, zb1)}). The traced bubble of the engine's 1F1B step is "
                         f"{eng.get('bubble_traced', float('nan')):.3f} against a simulated "
                         f"{eng['bubble_simulated']:.3f} (a traced action starts when its input has arrived, so waits for a "
                         f"peer count as bubble).")]
    return blocks


def conclusions(bench: Bench, mb: Optional[MaxBatch], conv: Optional[Convergence], root) -> list[Block]:
    meta, out = bench.meta, []
    cfg = meta.get("configs", {})
    hbm, p2p = meta.get("hbm_copy_gbps"), meta.get("p2p_copy_gbps")
    base = run(bench, system="base", mode="practical10", config="L", prec="fp16", dp=1, pp=2, mp=1)
    e1 = run(bench, system="engine", mode="1f1b", config="L", prec="fp16", dp=1, pp=2, mp=1)
    ez = run(bench, system="engine", mode="zb1", config="L", prec="fp16", dp=1, pp=2, mp=1)
    xz = run(bench, system="engine", mode="zb1", config="X", prec="fp16", dp=1, pp=2, mp=1)
    tr = trace_of(bench, "L", "fp16")

    out.append(("h", "6.1 Pipeline bubble: the base code's main loss, now small"))
    if e1 and finite(e1.get("bubble_traced")):
        text = f"The engine's 1F1B step has a traced bubble of {e1['bubble_traced']:.3f} ({cite(bench, e1)})"
        if base and finite(base.get("bubble_measured")):
            text = (f"The base code's stop-and-wait pipeline idles {base['bubble_measured']:.1%} of its step at "
                    f"config L fp16 (measured against one GPU, {cite(bench, base)}; simulated "
                    f"{base['bubble_simulated']:.3f}). " + text)
        if xz and finite(xz.get("bubble_measured")):
            text += (f" and zb1 at config X measures {xz['bubble_measured']:.3f} against one GPU "
                     f"(simulated {xz['bubble_simulated']:.3f}, {cite(bench, xz)})")
        out.append(("p", text + ". At m=8 micro-batches the bubble is no longer what limits the engine."))
        if finite(e1.get("bubble_simulated")):
            text = (f"Traced over simulated: {e1['bubble_traced'] / e1['bubble_simulated']:.2f}x. The unit-cost "
                    f"simulation has equal stages and no transfer time; in the trace the last stage is slower (it "
                    f"also computes the loss and stage 0 skips its first layer's input gradient), so stage 0 "
                    f"waits for every gradient, and each hand-off costs a transfer and its launches.")
            if finite(e1.get("bubble_calibrated")):
                text += (f" The same schedule simulated with each stage's measured action durations idles "
                         f"{e1['bubble_calibrated']:.3f}: the executor adds "
                         f"{e1['bubble_traced'] / e1['bubble_calibrated'] - 1:.0%} over it.")
            out.append(("p", text))
    else:
        out.append(("p", f"Bubble comparison: {NOT_MEASURED}."))

    out.append(("h", "6.2 Memory bandwidth: per-micro-batch fp32 gradient accumulation"))
    if tr and e1 and ez and hbm and "L" in cfg:
        c = cfg["L"]
        f_ms, b_ms = durations(tr, "F"), durations(tr, "B")
        params = c["depth"] // 2 * (c["dim"] ** 2 + c["dim"])
        gbytes = params * 8 / 1e9  # read + write the fp32 main gradient once per micro-batch
        t32 = trace_of(bench, "L", "fp32")
        ratio32 = f" (fp32 trace: {durations(t32, 'B') / durations(t32, 'F'):.1f}x)" if t32 else ""
        out.append(("p", f"In the traced L fp16 1F1B step ({rel(tr.path, root)}) a backward of one micro-batch "
                         f"({c['batch'] // c['micro']} rows) takes {b_ms:.2f} ms, {b_ms / f_ms:.1f}x its forward "
                         f"({f_ms:.2f} ms), although it does 2x the FLOPs{ratio32}. The excess, {b_ms - 2 * f_ms:.2f} ms "
                         f"per backward, is of the order of reading and writing the stage's fp32 main gradients once "
                         f"(estimate: {params / 1e6:,.0f} M parameters x 8 bytes = {gbytes:.1f} GB at the measured "
                         f"HBM copy rate of {hbm:,.0f} GB/s = {gbytes / hbm * 1e3:.2f} ms). zb1 with merged weight "
                         f"gradients does that accumulation once per step: {ez['samples_s']:,.0f} vs "
                         f"{e1['samples_s']:,.0f} samples/s ({speedup(ez, e1)}, "
                         f"{cite(bench, ez)} vs {cite(bench, e1)})."))
        span = max(b[4] for row in tr.rows for b in row) - min(b[3] for row in tr.rows for b in row)
        out.append(("p", f"Outside the compute actions: the median step of {cite(bench, e1)} is {e1['step_ms']:.2f} ms "
                         f"while the traced step's actions span {span:.2f} ms; {e1['step_ms'] - span:.2f} ms "
                         f"({1 - span / e1['step_ms']:.0%}) go to the optimizer step on fp32 masters, the loss-scale "
                         f"check and the host."))
    else:
        out.append(("p", f"Backward vs forward time from a trace: {NOT_MEASURED}."))

    out.append(("h", "6.3 Communication"))
    if tr and p2p and "L" in cfg:
        c = cfg["L"]
        mbytes = c["batch"] // c["micro"] * c["dim"] * BYTES["fp16"] / 1e6
        us = mbytes / 1e3 / p2p * 1e6
        out.append(("p", f"Pipeline: one micro-batch's activation at L fp16 is {mbytes:.1f} MB, {us:.1f} us at the "
                         f"measured GPU-to-GPU copy rate of {p2p:,.0f} GB/s, {us / 1e3 / durations(tr, 'F'):.1%} of a "
                         f"forward: point-to-point traffic is hidden and not a bottleneck at this size."))
    dp2 = run(bench, system="engine", mode="dp", config="L", prec="fp16", dp=2, pp=1, mp=1)
    one = run(bench, system="engine", mode="single", config="L", prec="fp16")
    if dp2 and one and p2p and "L" in cfg and same_source(dp2, one):
        c = cfg["L"]
        gb = c["depth"] * (c["dim"] ** 2 + c["dim"]) * 4 / 1e9
        lost = dp2["step_ms"] - one["step_ms"] / 2
        rows = meta.get("gemm_tflops_by_rows", {})
        small = (f" The rest is smaller GEMMs: {c['batch'] // 2 // c['micro']} rows per micro-batch per replica; the "
                 f"card's fp16 GEMM runs at {rows['fp16_M128']:.0f} TFLOP/s with 128 rows vs {rows['fp16_M1024']:.0f} "
                 f"with 1024 (meta.gemm_tflops_by_rows).") if "fp16_M128" in rows and "fp16_M1024" in rows else ""
        out.append(("p", f"Data parallel: dp=2 reaches {dp2['samples_s'] / (2 * one['samples_s']):.0%} scaling "
                         f"efficiency ({cite(bench, dp2)} vs {cite(bench, one)}): its step is {dp2['step_ms']:.2f} ms "
                         f"against {one['step_ms'] / 2:.2f} ms for half the 1-GPU step, {lost:.1f} ms lost. The "
                         f"all-reduce of the {gb:.1f} GB fp32 gradient sends {gb:.1f} GB per GPU on a 2-rank ring, "
                         f"at least {gb / p2p * 1e3:.1f} ms at {p2p:,.0f} GB/s. The per-layer buckets start as soon as "
                         f"their gradients are final, but with merged weight gradients that happens only in the "
                         f"step's last ~3 ms: in a dp=2 profile (experiments/results/raw/*-profile-logs.tgz) 13 of 16 "
                         f"bucket all-reduces ran after it, back to back, ~0.9 ms each." + small))
    if not (tr and p2p) and not (dp2 and one):
        out.append(("p", f"Communication costs: {NOT_MEASURED}."))

    out.append(("h", "6.4 GEMM size and precision"))
    best = {k: max((r for r in bench.runs if ok(r) and r["system"] == "engine" and r.get("config") == k
                    and r.get("prec") == "fp16"), key=lambda r: r["samples_s"], default=None) for k in cfg}
    parts = [f"config {k} ({cfg[k]['batch'] // cfg[k]['micro']} rows per micro-batch) {r['mfu']:.1%} MFU of the "
             f"datasheet peak "
             f"({r['mode']}, {cite(bench, r)})" for k, r in best.items() if r and finite(r.get("mfu"))]
    if parts:
        out.append(("p", "The engine's best fp16 run reaches " + "; ".join(parts) + ". Small micro-batches leave the "
                         "step to fixed per-action costs (memory traffic, launches); large ones are GEMM-bound."))
    e32 = run(bench, system="engine", mode="zb1", config="L", prec="fp32", dp=1, pp=2, mp=1)
    p32 = run(bench, system="peer", mode="1f1b", config="L", prec="fp32", dp=1, pp=2, mp=1)
    if e32 and p32 and ez and same_source(e32, p32):
        out.append(("p", f"fp32 is compute-bound: the engine's zb1 runs at {e32['gemm_fraction']:.1%} of the measured "
                         f"fp32 GEMM rate "
                         f"({cite(bench, e32)}), so scheduling gains only {e32['samples_s'] / p32['samples_s']:.2f}x "
                         f"over the peer's 1F1B; fp16 gives the engine {speedup(ez, e32)} the "
                         f"fp32 throughput at the same config."))
    tp, ptp = (run(bench, system=s, mode="tp", config="L", prec="fp16") for s in ("engine", "peer"))
    if tp and ptp and same_source(tp, ptp):
        out.append(("p", f"Tensor parallel (mp=2): the engine's TP layers run {tp['samples_s'] / ptp['samples_s']:.2f}x "
                         f"the samples/s of torch DTensor ({cite(bench, tp)} vs {cite(bench, ptp)})."))

    out.append(("h", "6.5 Memory"))
    if mb and mb.ratios:
        vals = [f"{k.replace('_over_fp32', '')}: {v['value']:.2f}x the fp32 max batch under {search.shape} "
                f"(target {v['target']})"
                for search in (mb, *mb.others) for k, v in (search.ratios or {}).items()
                if isinstance(v, dict) and finite(v.get("value"))]
        out.append(("p", ("; ".join(vals) or f"max batch ratios: {NOT_MEASURED}") + f" ({rel(mb.path, root)})."))
    else:
        out.append(("p", f"Largest batch with AMP vs fp32 (and with recomputation): {NOT_MEASURED}."))
    if conv and "fp32" in conv.curves and len(conv.curves) > 1:
        ref = conv.curves["fp32"][-1]
        diffs = [f"{k} ends at {c[-1]:.4g} vs fp32 {ref:.4g} ({(c[-1] - ref) / ref:+.2%})"
                 for k, c in conv.curves.items() if k != "fp32" and ref]
        out.append(("p", "Convergence: " + "; ".join(diffs) + f" after {len(conv.curves['fp32'])} steps."))
    else:
        out.append(("p", f"fp16 vs fp32 loss curves: {NOT_MEASURED}."))

    missed = [f"{k}: {v:.3f}, goal {bench.details.get(k, {}).get('target')}" for k, v in bench.ratios.items()
              if bench.details.get(k, {}).get("met") is False and finite(v)]
    out.append(("h", "6.6 Targets missed (section 5)"))
    out += [("b", m) for m in missed] if missed else [("p", "None of the measured targets was missed.")]
    return out
