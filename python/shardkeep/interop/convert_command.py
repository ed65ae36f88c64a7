"""``shardkeep convert``: the command-line tool's conversion, which needs
the Python libraries that read other formats (tensorstore, torch). The C++
tool runs ``python -m shardkeep.interop.convert_command SRC DST
[--from FORMAT] [--allow-pickle] [--step N]``; exit codes are the tool's:
0 done, 2 bad arguments, 3 failed."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="shardkeep convert",
        description="Write a shardkeep checkpoint from an Orbax, PyTorch DCP or safetensors one.")
    parser.add_argument("src", metavar="SRC", help="the checkpoint to convert (a path or a storage URL)")
    parser.add_argument("dst", metavar="DST", help="where to write the shardkeep checkpoint")
    parser.add_argument("--from", dest="source_format", default=None,
                        choices=("orbax", "dcp", "safetensors"),
                        help="the source's format (default: found from its files)")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="DCP only: unpickle its metadata file (runs code from the "
                             "checkpoint: only for checkpoints you trust)")
    parser.add_argument("--step", type=_step, default=None,
                        help="the step to record in the checkpoint (default: the Orbax "
                             "step folder's number, when there is one)")
    args = parser.parse_args(argv)  # exits 2 on bad arguments
    import shardkeep as sk

    try:
        sk.convert(args.src, args.dst, source_format=args.source_format,
                   allow_pickle=args.allow_pickle, step=args.step)
    except sk.ShardkeepError as e:
        print(f"shardkeep convert: {args.src}: {e}", file=sys.stderr)
        return 3
    print(f"converted {args.src} -> {args.dst}")
    return 0


def _step(text: str) -> int:
    step = int(text)
    if step < 0:
        raise argparse.ArgumentTypeError(f"a step is 0 or more, got {step}")
    return step


if __name__ == "__main__":
    sys.exit(main())
