#!/usr/bin/env python3
"""hybrid_engine driver: DP x PP x MP training of the models of hybrid_engine/models/registry.py (`--help` lists
them; the CLI is hybrid_engine/train/cli.py).

    python -m hybrid_engine.launch --nproc_per_node=8 hybrid_engine.py --dp 2 --pp 2 --mp 2

`python -m hybrid_engine` and the `hybrid-engine` command run the same CLI.
"""
import sys

try:
    from hybrid_engine.train.cli import run
except ImportError as exc:  # not built, or built against another torch: the message is the whole story
    if not str(exc).startswith("hybrid_engine"):
        raise
    sys.exit(f"hybrid_engine: error: {exc}")

if __name__ == "__main__":
    sys.exit(run())
