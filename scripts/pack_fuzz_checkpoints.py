"""Packs every checkpoint under a folder into one input of checkpoint_fuzzer.

    python3 scripts/pack_fuzz_checkpoints.py <folder> <out_dir>

A checkpoint is a folder holding _SHARDKEEP. The layout of an input is
described in cpp/fuzz/checkpoint_fuzzer.cc: a flags byte, then for each
file its path length (u8), path, content length (u32 little-endian) and
content.
"""

import os
import struct
import sys

# Reseal index trailers, recompute chunk checksums and list the meta.json
# and value checksums in _SHARDKEEP (sealing its own) after mutation, so
# that mutated inputs get past the checksums to the checks behind them.
FLAGS = 0b111


def pack(checkpoint: str) -> bytes:
    out = bytearray([FLAGS])
    for folder, _, files in sorted(os.walk(checkpoint)):
        for name in sorted(files):
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, checkpoint).replace(os.sep, "/").encode()
            with open(path, "rb") as f:
                content = f.read()
            out += bytes([len(relative)]) + relative + struct.pack("<I", len(content)) + content
    return bytes(out)


def main() -> None:
    root, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    for folder, _, files in os.walk(root):
        if "_SHARDKEEP" in files:
            name = os.path.relpath(folder, root).replace(os.sep, "_").strip(".") or "checkpoint"
            with open(os.path.join(out_dir, name), "wb") as f:
                f.write(pack(folder))


if __name__ == "__main__":
    main()
