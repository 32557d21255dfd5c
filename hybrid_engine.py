#!/usr/bin/env python3
"""hybrid_engine driver: DP x PP x MP training of the course MLP or a GPT (the CLI is hybrid_engine/train/cli.py).

    python -m hybrid_engine.launch --nproc_per_node=8 hybrid_engine.py --dp 2 --pp 2 --mp 2

`python -m hybrid_engine` and the `hybrid-engine` command run the same CLI.
"""
import sys

from hybrid_engine.train.cli import run

if __name__ == "__main__":
    sys.exit(run())
