"""W7's input: the model written as Hugging Face-style sharded safetensors.

python safetensors_files.py --root ROOT --scale SCALE writes, with the
`safetensors` library, ROOT/W7/model/model-0000i-of-0000n.safetensors
(tensors in leaf order, a new file once one holds a quarter of the model,
so every scale has several files, ~1 GiB each at full scale) and
model.safetensors.index.json (total_size and the weight_map from tensor
name to file), as `save_pretrained` lays them out. The suite writes them
once per run, outside the clock; every W7 measurement reads the same files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402

INDEX = "model.safetensors.index.json"
FILES_PER_MODEL = 4


def model_dir(root: str) -> str:
    return os.path.join(root, "W7", "model")


def index_path(root: str) -> str:
    return os.path.join(model_dir(root), INDEX)


def file_groups(scale: str) -> list[list[workloads.Leaf]]:
    """The leaves of each file, in order: a file is closed once it holds at
    least a quarter of the model's bytes."""
    leaves = workloads.leaves("W7", scale)
    limit = -(-sum(leaf.nbytes for leaf in leaves) // FILES_PER_MODEL)
    groups, current, size = [], [], 0
    for leaf in leaves:
        current.append(leaf)
        size += leaf.nbytes
        if size >= limit:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups


def write(root: str, scale: str) -> dict:
    from safetensors.numpy import save_file
    folder = model_dir(root)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    groups = file_groups(scale)
    weight_map, total = {}, 0
    for i, group in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {workloads.tensor_name(leaf): workloads.leaf_values(leaf) for leaf in group}
        save_file(tensors, os.path.join(folder, name), metadata={"format": "pt"})
        del tensors
        for leaf in group:
            weight_map[workloads.tensor_name(leaf)] = name
            total += leaf.nbytes
    with open(os.path.join(folder, INDEX), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    os.sync()
    return {"files": len(groups), "bytes": total}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--scale", default="small", choices=sorted(workloads.LLAMA_SCALES))
    args = parser.parse_args(argv)
    print(json.dumps(write(os.path.abspath(args.root), args.scale)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
