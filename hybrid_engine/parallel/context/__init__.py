"""Context parallelism: each sequence split over the cp ranks (chunks.py: the head-tail split), attention over
the whole sequence by a ring of K/V blocks (ring.py) or an all-gather of K/V (all_gather.py), one block of
attention with its log-sum-exp (block_attention.py), the transfers (comm.py), what a block asks (attention.py; the
choice between ring and all-gather is the planner's, planner/context_comm.py), and a stage made context-parallel
from outside (apply.py)."""
from .apply import apply_context_parallel
from .attention import CP_COMMS, ContextParallel
from .chunks import check_sequence, local_chunks, positions

__all__ = ["CP_COMMS", "ContextParallel", "apply_context_parallel", "check_sequence", "local_chunks",
           "positions"]
