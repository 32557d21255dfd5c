"""What context parallelism's K/V traffic costs one layer's attention, per micro-batch on one cp rank, and the rule
that picks the ring or the all-gather under --cp-comm auto (`choose_comm`: the planner asks it for every plan, and
the engine at a run's first attention, through `comm_rule`).

With b rows of s tokens on the rank, w K and V elements per token (2 x kv heads x head dim, this MP rank's), e bytes
an element, and A the rank's forward attention (the head-tail split gives each of the cp blocks A / cp; a block's
backward takes card.ATTENTION_BACKWARD times its forward), as parallel/context/ring.py and all_gather.py send them:

  ring, forward    cp - 1 hops of the K/V block (b s w e bytes) at the card's P2P rate; hop t is in flight while
                   block t's attention runs, so what shows is what a hop takes beyond its block
  ring, backward   the K/V blocks round again (cp - 1 hops) and each block's fp32 dK/dV accumulator one hop behind
                   it (cp hops of b s w 4 bytes): during block t's backward hop t's K/V and block t - 1's
                   accumulator travel; the last accumulator's hop home follows the last block, exposed whole
  all-gather       forward: one all-gather of the K/V (cp b s w e bytes gathered); backward: the same again and a
                   reduce-scatter of the whole sequence's fp32 dK/dV; each at the card's bus rate, waited for before
                   the attention that needs it (nothing overlaps them)

Every transfer pays the card's latency once. The ring sends about the bytes the all-gather does but hides them
behind its blocks; the all-gather pays one latency a collective instead of one a hop. So the all-gather is the
cheaper while a block's attention (growing with s^2) is too short to hide a hop (growing with s): a short share of
the sequence; the ring once the blocks hide the hops.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .card import ATTENTION_BACKWARD, Card

GRAD_BYTES = 4  # the dK/dV accumulators travel in fp32


@dataclass(frozen=True)
class KvTraffic:
    """One layer's attention on one cp rank for one micro-batch, as its transfers see it."""

    cp: int
    tokens: float
    """Rows x the rank's share of each sequence."""
    kv_width: float
    """K and V elements per token, this MP rank's kv heads."""
    elem: int
    """Bytes of a K/V element."""
    attention_s: float
    """The rank's forward attention for the micro-batch, every block's."""

    @property
    def kv_bytes(self) -> float:
        """One rank's K/V block: what one ring hop carries."""
        return self.tokens * self.kv_width * self.elem

    @property
    def grad_bytes(self) -> float:
        """One rank's dK/dV accumulator."""
        return self.tokens * self.kv_width * GRAD_BYTES

    @property
    def block_s(self) -> float:
        """One block's forward attention: the compute a forward hop hides under."""
        return self.attention_s / self.cp


@dataclass(frozen=True)
class CommCost:
    """What one variant's transfers leave exposed of a layer's forward and backward, per micro-batch."""

    name: str
    forward_s: float
    backward_s: float

    @property
    def exposed_s(self) -> float:
        return self.forward_s + self.backward_s


def ring_cost(card: Card, t: KvTraffic) -> CommCost:
    """The ring's hops beyond the blocks they overlap (parallel/context/ring.py)."""
    if t.cp == 1:
        return CommCost("ring", 0.0, 0.0)
    block_f, block_b = t.block_s, ATTENTION_BACKWARD * t.block_s
    kv, grad, both = card.hop_s(t.kv_bytes), card.hop_s(t.grad_bytes), card.hop_s(t.kv_bytes + t.grad_bytes)
    forward = (t.cp - 1) * max(0.0, kv - block_f)
    backward = (max(0.0, kv - block_b)  # block 0: the first K/V hop
                + (t.cp - 2) * max(0.0, both - block_b)  # blocks 1 .. cp - 2: a K/V hop and the last accumulator
                + max(0.0, grad - block_b)  # block cp - 1: the accumulator of block cp - 2
                + grad)  # the last accumulator home, after the last block
    return CommCost("ring", forward, backward)


def all_gather_cost(card: Card, t: KvTraffic) -> CommCost:
    """The all-gather's collectives, none overlapped (parallel/context/all_gather.py)."""
    gather = card.collective_s(t.cp * t.kv_bytes, t.cp, 1.0)
    scatter = card.collective_s(t.cp * t.grad_bytes, t.cp, 1.0)
    return CommCost("all-gather", gather, gather + scatter)


@dataclass(frozen=True)
class CommChoice:
    """The variant that runs, both variants' costs, and why, in words."""

    name: str
    ring: CommCost
    all_gather: CommCost
    why: str

    @property
    def cost(self) -> CommCost:
        return self.ring if self.name == "ring" else self.all_gather


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def choose_comm(asked: str, card: Card, t: KvTraffic) -> CommChoice:
    """The one rule: --cp-comm ring or all-gather as asked; auto, the variant that exposes less of a layer's
    forward and backward (the ring on a tie: it keeps no whole-sequence K/V)."""
    ring, gather = ring_cost(card, t), all_gather_cost(card, t)
    if asked != "auto":
        return CommChoice(asked, ring, gather, "--cp-comm")
    name = "ring" if ring.exposed_s <= gather.exposed_s else "all-gather"
    chosen, other = (ring, gather) if name == "ring" else (gather, ring)
    why = (f"auto: K/V traffic exposes {ms(chosen.exposed_s)} ms a layer and micro-batch against the {other.name}'s "
           f"{ms(other.exposed_s)}: a ring hop of {t.kv_bytes / 2**20:.3g} MiB takes {ms(card.hop_s(t.kv_bytes))} ms "
           f"on the {card.name} beside {ms(t.block_s)} ms of a block's attention")
    return CommChoice(name, ring, gather, why)


def comm_rule(asked: str, card: Card) -> Callable:
    """(q, k, cp, kernel) -> CommChoice for a rank's attention tensors (q [b, heads, s, d], k [b, kv heads, s, d],
    this rank's s tokens of a cp-way split) whose blocks `kernel` computes (block_attention.pick_backend's):
    `choose_comm` on what the tensors say, the attention timed as the planner times a decoder's (through
    autograd)."""
    from hybrid_engine.models.planner_shape import causal_attention_flops

    from .step_time import AUTOGRAD_SLOWDOWN

    compute_scale = AUTOGRAD_SLOWDOWN * card.compute_scale

    def rule(q, k, cp: int, kernel: str) -> CommChoice:
        b, heads, s, d = q.shape
        half = q.element_size() < 4
        flops = causal_attention_flops(cp * s, heads * d) * b * s
        t = KvTraffic(cp, b * s, 2 * k.shape[1] * d, k.element_size(),
                      compute_scale * card.attention_s(flops, half, kernel))
        return choose_comm(asked, card, t)

    return rule
