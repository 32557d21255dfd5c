"""`python -m hybrid_engine.hf import HF_DIR CKPT` and `python -m hybrid_engine.hf export CKPT HF_DIR`: Hugging Face
Llama-family models in and out of engine checkpoints (hybrid_engine/hf/convert.py). Every failure is one line on
stderr and exit 2."""
from __future__ import annotations

import argparse
import math
import sys
from typing import Optional, Sequence

from hybrid_engine.config.engine import ConfigError

from .convert import DTYPES, MODEL_TOML, export_model, import_model


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybrid_engine.hf", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="a Hugging Face model directory -> a checkpoint any grid loads")
    imp.add_argument("hf_dir", metavar="HF_DIR", help="config.json and model.safetensors (or its sharded index)")
    imp.add_argument("ckpt", metavar="CKPT", help="a new checkpoint directory (CKPT/step_000000, CKPT/latest)")
    exp = sub.add_parser("export", help="a checkpoint (written on any grid) -> a Hugging Face model directory")
    exp.add_argument("ckpt", metavar="CKPT", help="DIR/step_N, or a --save DIR (its latest)")
    exp.add_argument("hf_dir", metavar="HF_DIR", help="where config.json and the safetensors go")
    exp.add_argument("--dtype", choices=tuple(DTYPES), default="auto",
                     help="the tensors' dtype (default auto: the checkpoint's own)")
    exp.add_argument("--like", metavar="HF_DIR", default=None,
                     help="keep this model directory's config.json (checked to be the checkpoint's shape) and copy "
                          "its tokenizer and generation config")
    exp.add_argument("--max-shard-gib", type=float, default=4.0, help="largest safetensors shard (default 4)")
    exp.add_argument("--force", action="store_true", help="replace an existing config.json and weights in HF_DIR")
    args = parser.parse_args(argv)
    try:
        if args.command == "import":
            path, notes = import_model(args.hf_dir, args.ckpt)
            for note in notes:
                print(note)
            print(f"wrote {path}; train it on any grid with: --config {args.ckpt}/{MODEL_TOML} --load {args.ckpt} "
                  "--data TOKENS")
        else:
            if not (args.max_shard_gib > 0 and math.isfinite(args.max_shard_gib)):
                raise ConfigError(f"--max-shard-gib must be a positive number of GiB, got {args.max_shard_gib}")
            files = export_model(args.ckpt, args.hf_dir, args.dtype, args.like, int(args.max_shard_gib * 2**30),
                                 args.force)
            print(f"wrote {args.hf_dir}: {', '.join(files)}")
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from hybrid_engine.runtime.entry import run_command

    sys.exit(run_command("python -m hybrid_engine.hf", main))
