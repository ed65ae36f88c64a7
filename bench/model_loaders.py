"""W7's loaders: a model in Hugging Face-style safetensors files
(safetensors_files.py) loaded onto a target of ShapeDtypeStructs with
shardings. Each returns the loaded arrays (block_until_ready) keyed so that
``lookup(loaded, leaf)`` finds them.

- shardkeep: ``shardkeep.load_safetensors(index_json, target)`` with the
  nested target (default mapping: key path joined by ".").
- safetensors: the library as its users load a sharded model onto a
  sharding: the index's weight_map, then per file ``safe_open(file,
  framework="numpy")`` and, per tensor, ``jax.make_array_from_callback``
  whose callback takes the device's box with ``get_slice(name)[index]``
  (only that box's bytes are copied out of the file's memory map). This
  beats ``get_tensor`` + ``device_put`` + resharding, which copies every
  tensor whole first.
- orbax / orbax-tuned: orbax-checkpoint's own safetensors loader (v1 API):
  ``ocp.load(folder, abstract_state=flat dict)`` under
  ``ocp.Context(checkpoint_layout=CheckpointLayout.SAFETENSORS)``; each
  tensor's sharding drives which byte ranges are read. ``orbax-tuned``
  raises the in-flight read limit (``MemoryOptions.read_concurrent_bytes``)
  past the model's size, as ``orbax-tuned`` raises restore_concurrent_gb
  elsewhere.
"""

from __future__ import annotations

import json
import os

import jax

import safetensors_files
import workloads

TOOLS = ("shardkeep", "shardkeep-baseline", "safetensors", "orbax", "orbax-tuned")


def make(name: str):
    if name.startswith("shardkeep"):  # this build or the baseline's (suite.py --baseline)
        return Shardkeep()
    if name == "safetensors":
        return SafetensorsLibrary()
    if name in ("orbax", "orbax-tuned"):
        return OrbaxSafetensors(tuned=name == "orbax-tuned")
    raise ValueError(f"{name} has no safetensors loader in this benchmark")


def flat_target(target: dict, scale: str) -> dict:
    """{tensor name: ShapeDtypeStruct} of a nested W7 target."""
    return {workloads.tensor_name(leaf): _get(target, leaf.path)
            for leaf in workloads.leaves("W7", scale)}


def lookup(loaded: dict, leaf: workloads.Leaf):
    name = workloads.tensor_name(leaf)
    return loaded[name] if name in loaded else _get(loaded, leaf.path)


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


class Shardkeep:
    framework = "jax"

    def __init__(self):
        import shardkeep
        self.sk = shardkeep

    def version(self) -> str:
        from importlib.metadata import version
        return version("shardkeep")

    def load(self, root: str, target: dict, scale: str):
        return jax.block_until_ready(
            self.sk.load_safetensors(safetensors_files.index_path(root), target))


class SafetensorsLibrary:
    framework = "jax"

    def __init__(self):
        import safetensors
        self.safe_open = safetensors.safe_open

    def version(self) -> str:
        from importlib.metadata import version
        return version("safetensors")

    def load(self, root: str, target: dict, scale: str):
        wanted = flat_target(target, scale)
        folder = safetensors_files.model_dir(root)
        with open(safetensors_files.index_path(root)) as f:
            weight_map = json.load(f)["weight_map"]
        by_file: dict[str, list[str]] = {}
        for name in wanted:
            by_file.setdefault(weight_map[name], []).append(name)
        arrays = {}
        for file, names in by_file.items():
            with self.safe_open(os.path.join(folder, file), framework="numpy") as f:
                for name in names:
                    box = f.get_slice(name)
                    want = wanted[name]
                    arrays[name] = jax.make_array_from_callback(
                        want.shape, want.sharding, lambda index, box=box: box[index])
        return jax.block_until_ready(arrays)


class OrbaxSafetensors:
    framework = "jax"

    def __init__(self, tuned: bool):
        from orbax.checkpoint import v1 as ocp
        self.ocp = ocp
        self.tuned = tuned

    def version(self) -> str:
        from importlib.metadata import version
        return version("orbax-checkpoint")

    def load(self, root: str, target: dict, scale: str):
        ocp = self.ocp
        kwargs = {}
        if self.tuned:
            kwargs["memory_options"] = ocp.options.MemoryOptions(
                read_concurrent_bytes=1024 << 30)
        with ocp.Context(checkpoint_layout=ocp.options.CheckpointLayout.SAFETENSORS, **kwargs):
            return jax.block_until_ready(ocp.load(safetensors_files.model_dir(root),
                                                  abstract_state=flat_target(target, scale)))
