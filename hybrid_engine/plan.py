"""`python -m hybrid_engine.plan`: for a world size and a model, a ranked table of grids (dp x pp x mp) and each
one's best plan (schedule, micro-batches, memory), with why the others lose; the planner lives in
hybrid_engine/planner/. Takes the driver's model, batch and precision flags::

    python -m hybrid_engine.plan --world-size 8 --model gpt --hidden 2048 --layers 16 --batch-size 16 --amp bf16 \\
        --plan-card h200 [--memory-cap-gib 80] [--calibrate]
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from hybrid_engine.config.run import ConfigError
from hybrid_engine.models import registry


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybrid_engine.plan", add_help=False)
    parser.add_argument("--world-size", type=int, default=1, help="ranks (GPUs) to plan for")
    parser.add_argument("--calibrate", action="store_true", help="measure this device's GEMM and memory rates")
    parser.add_argument("-h", "--help", action="store_true")
    known, rest = parser.parse_known_args(argv)
    if known.help:
        print(__doc__)
        return 0
    from hybrid_engine.planner.card import calibrate, this_device
    from hybrid_engine.planner.grids import grid_table
    from hybrid_engine.train.cli import device_type, parse_config

    try:
        if known.world_size < 1:
            raise ConfigError(f"--world-size must be >= 1, got {known.world_size}")
        cfg = parse_config(list(rest), "python -m hybrid_engine.plan")
        kind = device_type(cfg.parallel.device)
        card = this_device(cfg.plan.card, kind)
        if known.calibrate:
            card = calibrate(card, kind)
        print(grid_table(cfg, known.world_size, kind, registry.check_model, card))
    except ConfigError as exc:
        print(f"python -m hybrid_engine.plan: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
