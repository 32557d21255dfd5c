"""The measured-looking numbers of README.md and docs/ that are no measurement, so no results file holds them: each
(page, a phrase of the page around the number, why it is not a measurement). A phrase that leaves its page fails
test_doc_number_guard.py, so this list cannot outlive the text it excuses."""
from __future__ import annotations

SETTING = "a setting of the run (a flag's value), not a result"
DATASHEET = "the card's datasheet peak, the denominator of MFU"
GOAL = "a goal the page measures against, not a result"
PLANNER_RULE = "the planner's rule (planner/memory.py CAP_MARGIN, planner/refit.py SWITCH_GAIN), not a result"
BOUND = "the time bound the named test holds the failure to (its timeout), not a measurement"

NOT_MEASUREMENTS = [
    ("README.md", "largest batch, pp=2, 8 GiB per GPU", SETTING + " (--memory-cap-gib 8)"),
    ("README.md", "Llama-1B-like shape at 128k tokens a sequence", SETTING + " (--seq-len 131072)"),
    ("README.md", "47.5 GiB per GPU; at 32k 124,558 | at 32k: torch context_parallel 95,441 | at 32k:",
     SETTING + " (--seq-len 32768 of the runs compared)"),
    ("README.md", "Llama-8B shape in 78 GiB, the planner's", SETTING + " (--memory-cap-gib 78)"),
    ("docs/planning.md", "takes the 8B at dp4 under a 78 GiB cap", SETTING + " (--memory-cap-gib 78)"),
    ("docs/planning.md", "pins those three runs' steps within 15%", GOAL + " (the bound a step prediction is held to)"),
    ("docs/performance.md", "zero 2 and 3 under `--memory-cap-gib 78` to stand in for an 80 GB H100",
     SETTING + " (--memory-cap-gib 78), and the card it stands in for"),
    ("docs/performance.md", "Zero 3's peak is 66% of zero 1's, not the goal of 45%", GOAL + " (the 45%)"),
    ("docs/performance.md", "the 8B shape's plan under a 78 GiB cap", SETTING + " (--memory-cap-gib 78)"),
    ("docs/performance.md", "Zero 3's goal of 45% of zero 1's peak", GOAL + " (the 45%)"),
    ("docs/performance.md", "(the goals are 2.5× and 2×)", GOAL),
    ("docs/long_sequences.md", "| one GPU, 8k |", SETTING + " (--seq-len 8192)"),
    ("docs/long_sequences.md", "| cp4, 16k |", SETTING + " (--seq-len 16384)"),
    ("docs/long_sequences.md", "| cp4, 16k, `--cp-comm all-gather` |", SETTING + " (--seq-len 16384)"),
    ("docs/long_sequences.md", "| cp4, 32k |", SETTING + " (--seq-len 32768)"),
    ("docs/long_sequences.md", "| cp4, 32k, `--cp-kernel flash` |", SETTING + " (--seq-len 32768)"),
    ("docs/long_sequences.md", "| cp4, 32k, `--cp-comm all-gather` |", SETTING + " (--seq-len 32768)"),
    ("docs/long_sequences.md", "| cp2 × tp2, 32k |", SETTING + " (--seq-len 32768)"),
    ("docs/long_sequences.md", "| cp4, 64k |", SETTING + " (--seq-len 65536)"),
    ("docs/long_sequences.md", "| cp4, 128k |", SETTING + " (--seq-len 131072)"),
    ("docs/long_sequences.md", "`context_parallel`, cp4, 32k |", SETTING + " (--seq-len 32768)"),
    ("docs/long_sequences.md", "the blocks of cp4 at 32k", SETTING + " (--seq-len 32768)"),
    ("docs/long_sequences.md", "At 32k cp4 is", SETTING + " (--seq-len 32768)"),
    ("docs/long_sequences.md", "(the goal is 1.2×", GOAL),
    ("docs/long_sequences.md", "of one GPU's at 8k (the goal is 0.9)", SETTING + " (--seq-len 8192) and " + GOAL),
    ("docs/long_sequences.md", "A sequence of 128k tokens trains", SETTING + " (--seq-len 131072)"),
    ("docs/long_sequences.md", "the ring at 32k, as the planner's rule", SETTING + " (--seq-len 32768)"),
    ("docs/long_sequences.md", "for four ranks of 8k tokens. At 16k (4k tokens a rank)",
     SETTING + " (--seq-len 32768 and 16384: 8192 and 4096 a rank)"),
    ("docs/long_sequences.md", "the ring's 16k step", SETTING + " (--seq-len 16384)"),
    ("docs/long_sequences.md", "At 4k tokens a rank", SETTING + " (--seq-len 16384 on cp 4)"),
    ("docs/performance.md", "each GPU capped at 8 GiB", SETTING + " (--memory-cap-gib 8)"),
    ("docs/failures.md", "for the others up to 20 s",
     "the error agreement's grace period (runtime/exit_together.py agree_on_error's grace_s), not a result"),
    ("docs/failures.md", "joined the process group within --comm-timeout 8 s",
     "the message quotes the --comm-timeout the example set"),
    ("docs/failures.md", "Timed out waiting 8000ms", "the message quotes the --comm-timeout the example set"),
    ("docs/failures.md", "SIGKILL, 3 ranks, under 60 s]", BOUND),
    ("docs/failures.md", "each job bounded at 28 s after the freeze]", BOUND),
    ("docs/failures.md", "all ranks gone within 28 s]", BOUND),
    ("docs/failures.md", "--comm-timeout 5, bounded at 45 s]", BOUND),
    ("docs/failures.md", "its SIGKILL comes 30 s later", "torchrun's fixed grace between its SIGTERM and SIGKILL"),
    ("docs/failures.md", "at 127.0.0.1:29500 within 5 s", "the message quotes the rendezvous store's connect timeout"),
    ("docs/gpt.md", "a GELU MLP of 4× width", "the model's shape"),
    ("docs/performance.md", "each of 8 MB took", "a message's size: a replica's 512 rows × 8192 fp16 activations"),
    ("docs/gpt.md", "The last ~1% of the tokens is held out", "how the data is split, a fixed rule of the loader"),
    ("docs/llama.md", "the GPT block's 196,608 weights", "arithmetic of the shape: 4·128² + 2·128·512"),
    ("docs/llama.md", "MFU over the 989 TFLOP/s bf16 datasheet peak", DATASHEET),
    ("docs/performance.md", "datasheet dense peak (989 TFLOP/s", DATASHEET),
    ("docs/llama.md", "to say which side of 2× it is", GOAL),
    ("docs/llama.md", "(another job, another machine), not 4×",
     "the ideal of four cards, the bound a result sits under"),
    ("docs/performance.md", "The goals (90% weak, 80% strong)", GOAL),
    ("docs/performance.md", "The goal, 1.1× torch.compile", GOAL),
    ("docs/planning.md", "(safe, not yet within 10%)", GOAL),
    ("docs/planning.md", "a plan within 3% of the cap is not taken", PLANNER_RULE),
    ("docs/planning.md", "predicted to need at least 3% less", PLANNER_RULE),
    ("docs/planning.md", "is predicted more than 5% faster", PLANNER_RULE),
    ("docs/planning.md", "within 10% over and never more than 3% under",
     GOAL + " (the memory model's, which its test holds)"),
    ("docs/planning.md", "an 80 GB card under ZeRO-3", "the card's memory, its datasheet size"),
    ("docs/planning.md", "predicted 9.27 ms/step, 7.4 GiB peak",
     "the cost model's prediction as the plan line prints it, an example of its form"),
    ("docs/planning.md", "predicted within 15% except the known misses",
     GOAL + " (the bound a step prediction is held to)"),
    ("docs/planning.md", '"mp4: 16 all-reduces per step, 2.94 ms exposed", "dp4: gradient collective 14.8 ms exposed"',
     "reasons the plan command prints, held by test_the_planning_example_is_what_its_command_prints_now"),
]

# Measurements no results file holds, kept in sight rather than excused: each says why the page still states it.
UNSOURCED = [
    ("README.md", "queued like any job, then ~30 s from the start to the first step",
     "no cluster run is recorded; README's test asks every command for a time"),
    ("README.md", "the same ~30 s to the first step", "the same estimate, for srun"),
]

