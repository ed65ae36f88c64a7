"""W9 worker: one tool's fine-tuning run, in a fresh process (see w9.py).

    python bench/w9_worker.py TOOL --scale S --root R --out FILE [--drop-caches]

The state: W1's parameters as a frozen bf16 base, LoRA adapters (a
rank-r pair per matrix, float32, about 1% of the base's bytes) and their
Adam moments, and the step. A loop updates the adapters and moments
(never the base) and saves after each update, SAVES times, keeping the
last 3 checkpoints. Per save: the time from the call until the checkpoint
is durable, and the bytes of files that appeared under the root (a hard
link to an earlier file is not new bytes). Then the last checkpoint is
loaded (warm, and cold with --drop-caches) and checked against the state
saved into it.

Tools:
  shardkeep            CheckpointManager(keep_last=3), the whole state
                       (unchanged arrays taken from the previous step)
  shardkeep-whole      the same with reuse_unchanged=False: every save whole
  shardkeep-trainable  the same saving only adapters, moments and step
  orbax                orbax CheckpointManager(max_to_keep=3), StandardSave
                       of the whole state (as shipped)
  dcp                  torch.distributed.checkpoint.save of the whole state,
                       the oldest step folder removed beyond 3
  dcp-trainable        the same with only the trainable tensors (the usual
                       workaround; such a checkpoint does not load alone)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
import traceback

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import page_cache  # noqa: E402
from training_loop import tensors  # noqa: E402
import workloads  # noqa: E402

TOOLS = ("shardkeep", "shardkeep-whole", "shardkeep-trainable", "orbax", "dcp",
         "dcp-trainable")
SAVES = 5
KEEP = 3
LOAD_REPS = 3
ADAPTER_SHARE = 0.01  # adapter bytes / base bytes


def base_leaves(scale: str) -> list[workloads.Leaf]:
    return [leaf for leaf in workloads.leaves("W1", scale) if leaf.path[0] == "params"]


def adapter_rank(scale: str) -> int:
    """The rank that makes the float32 adapters ADAPTER_SHARE of the base."""
    leaves = base_leaves(scale)
    base = sum(leaf.nbytes for leaf in leaves)
    edges = sum(sum(leaf.shape) for leaf in leaves if len(leaf.shape) == 2)
    return max(1, round(ADAPTER_SHARE * base / (4 * edges)))


def adapter_shapes(scale: str) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    """(path, shape) of each adapter matrix: a (rows, r) and an (r, cols)
    per matrix of the base."""
    r = adapter_rank(scale)
    out = []
    for leaf in base_leaves(scale):
        if len(leaf.shape) == 2:
            rows, cols = leaf.shape
            out += [(leaf.path[1:] + ("a",), (rows, r)), (leaf.path[1:] + ("b",), (r, cols))]
    return out


def trainable_bytes(scale: str) -> int:
    """Adapters and their two moments (float32), and the int32 step."""
    return 3 * sum(4 * int(np.prod(shape)) for _, shape in adapter_shapes(scale)) + 4


def tree_bytes_on_disk(root: str) -> dict:
    """{(inode, mtime, size): size} of the files under ``root``: a hard link
    shares its file's key, so it counts once."""
    files = {}
    for name in page_cache.files_under(root):
        try:
            st = os.lstat(name)
        except FileNotFoundError:  # removed by retention while listed
            continue
        files[(st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)] = st.st_size
    return files


# -- JAX tools --------------------------------------------------------------


def jax_state(scale: str):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = workloads.fsdp_mesh()
    base = workloads.jax_state("W1", scale)
    base = {"params": base["params"]}
    rows, cols = NamedSharding(mesh, P("fsdp", None)), NamedSharding(mesh, P(None, "fsdp"))
    adapters, mu, nu = [], [], []
    for i, (path, shape) in enumerate(adapter_shapes(scale)):
        sharding = rows if path[-1] == "a" else cols
        values = np.random.default_rng(i).standard_normal(shape, dtype=np.float32) * 0.01
        adapters.append((path, jax.device_put(values, sharding)))
        mu.append((path, jax.device_put(np.zeros(shape, np.float32), sharding)))
        nu.append((path, jax.device_put(np.zeros(shape, np.float32), sharding)))
    replicated = NamedSharding(mesh, P())
    trainable = {"adapters": workloads.nest(adapters),
                 "opt": {"mu": workloads.nest(mu), "nu": workloads.nest(nu)},
                 "step": jax.device_put(jnp.int32(0), replicated)}
    return base, jax.block_until_ready(trainable)


def jax_update():
    """An Adam-like step on the trainable part only; donates it."""
    import jax
    import jax.numpy as jnp

    def update(trainable):
        grads = jax.tree.map(lambda a: jnp.sin(a) * 1e-3, trainable["adapters"])
        mu = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, trainable["opt"]["mu"], grads)
        nu = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, trainable["opt"]["nu"], grads)
        adapters = jax.tree.map(lambda a, m, v: a - 1e-3 * m / (jnp.sqrt(v) + 1e-8),
                                trainable["adapters"], mu, nu)
        return {"adapters": adapters, "opt": {"mu": mu, "nu": nu},
                "step": trainable["step"] + 1}
    return jax.jit(update, donate_argnums=0)


def abstract(tree):
    import jax
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        tree)


class ShardkeepTool:
    def __init__(self, name: str, root: str):
        import shardkeep as sk
        self.sk = sk
        self.trainable_only = name == "shardkeep-trainable"
        self.manager = sk.CheckpointManager(root, keep_last=KEEP,
                                            reuse_unchanged=name != "shardkeep-whole")

    def saved(self, base, trainable):
        return trainable if self.trainable_only else {**base, **trainable}

    def save(self, step: int, state) -> None:
        self.manager.save(step, state)
        self.manager.wait()

    def path(self, step: int) -> str:
        return self.manager.step_path(step)

    def load(self, step: int, target):
        import jax
        return jax.block_until_ready(self.manager.load(step, target))

    def close(self):
        self.manager.close()


class OrbaxTool:
    def __init__(self, name: str, root: str):
        import orbax.checkpoint as ocp
        self.ocp = ocp
        self.trainable_only = False
        self.manager = ocp.CheckpointManager(
            root, options=ocp.CheckpointManagerOptions(max_to_keep=KEEP))

    def saved(self, base, trainable):
        return {**base, **trainable}

    def save(self, step: int, state) -> None:
        self.manager.save(step, args=self.ocp.args.StandardSave(state))
        self.manager.wait_until_finished()

    def path(self, step: int) -> str:
        return os.path.join(str(self.manager.directory), str(step))

    def load(self, step: int, target):
        import jax
        return jax.block_until_ready(
            self.manager.restore(step, args=self.ocp.args.StandardRestore(target)))

    def close(self):
        self.manager.close()


def run_jax(tool_name: str, scale: str, root: str, drop_caches: bool) -> dict:
    import jax
    tool = (OrbaxTool if tool_name == "orbax" else ShardkeepTool)(tool_name, root)
    base, trainable = jax_state(scale)
    update = jax_update()
    saves, expected = [], None
    for step in range(1, SAVES + 1):
        trainable = jax.block_until_ready(update(trainable))
        state = tool.saved(base, trainable)
        saves.append(_timed_save(lambda: tool.save(step, state), root))
        if step == SAVES:
            expected = {"adapter": np.asarray(_first_leaf(trainable["adapters"])),
                        "base": None if tool.trainable_only else
                        np.asarray(_first_leaf(base["params"]))}
    target = abstract(tool.saved(base, trainable))
    loads = _loads(lambda: tool.load(SAVES, target), tool.path(SAVES), drop_caches)
    loaded = tool.load(SAVES, target)
    ok = _matches(loaded, expected)
    tool.close()
    return {"saves": saves, "loads": loads, "verified": ok}


def _first_leaf(tree):
    import jax
    return jax.tree.leaves(tree)[0]


def _matches(loaded, expected) -> bool:
    same = np.asarray(_first_leaf(loaded["adapters"])).tobytes() == expected["adapter"].tobytes()
    if expected["base"] is not None:
        same = same and (np.asarray(_first_leaf(loaded["params"])).tobytes()
                         == expected["base"].tobytes())
    return same


# -- DCP ------------------------------------------------------------------


def torch_state(scale: str):
    import torch
    base = workloads.torch_state("W1", scale)
    base = {"params": base["params"]}
    adapters, mu, nu = [], [], []
    for i, (path, shape) in enumerate(adapter_shapes(scale)):
        values = np.random.default_rng(i).standard_normal(shape, dtype=np.float32) * 0.01
        adapters.append((path, torch.from_numpy(values)))
        mu.append((path, torch.zeros(shape)))
        nu.append((path, torch.zeros(shape)))
    trainable = {"adapters": workloads.nest(adapters),
                 "opt": {"mu": workloads.nest(mu), "nu": workloads.nest(nu)},
                 "step": torch.tensor(0, dtype=torch.int32)}
    return base, trainable


def torch_update(trainable) -> None:
    import torch
    with torch.no_grad():
        for a, m, v in zip(tensors(trainable["adapters"]), tensors(trainable["opt"]["mu"]),
                           tensors(trainable["opt"]["nu"])):
            g = torch.sin(a) * 1e-3
            m.mul_(0.9).add_(0.1 * g)
            v.mul_(0.999).add_(0.001 * g * g)
            a.sub_(1e-3 * m / (v.sqrt() + 1e-8))
        trainable["step"] += 1


def run_dcp(tool_name: str, scale: str, root: str, drop_caches: bool) -> dict:
    import copy

    import torch.distributed.checkpoint as dcp
    base, trainable = torch_state(scale)
    trainable_only = tool_name == "dcp-trainable"
    os.makedirs(root, exist_ok=True)
    saves = []
    for step in range(1, SAVES + 1):
        torch_update(trainable)
        state = trainable if trainable_only else {**base, **trainable}
        path = os.path.join(root, str(step))

        def save():
            dcp.save(state, checkpoint_id=path)
            if step > KEEP:
                shutil.rmtree(os.path.join(root, str(step - KEEP)))
        saves.append(_timed_save(save, root))
    path = os.path.join(root, str(SAVES))
    saved = trainable if trainable_only else {**base, **trainable}
    target = copy.deepcopy(saved)
    for t in tensors(target):
        t.zero_()

    def load():
        dcp.load(target, checkpoint_id=path)
        return target
    loads = _loads(load, path, drop_caches)
    ok = all(a.equal(b) for a, b in zip(tensors(load()), tensors(saved)))
    return {"saves": saves, "loads": loads, "verified": ok}


# -- measuring ------------------------------------------------------------


def _timed_save(save, root: str) -> dict:
    before = tree_bytes_on_disk(root) if os.path.isdir(root) else {}
    start = time.perf_counter()
    save()
    seconds = time.perf_counter() - start
    after = tree_bytes_on_disk(root)
    written = sum(size for key, size in after.items() if key not in before)
    return {"seconds": seconds, "bytes_written": written, "root_bytes": sum(after.values())}


def _loads(load, path: str, drop_caches: bool) -> dict:
    out = {}
    if drop_caches:
        cold = []
        for _ in range(LOAD_REPS):
            page_cache.evict(path, drop_caches=True)
            start = time.perf_counter()
            load()
            cold.append(time.perf_counter() - start)
        out["cold_seconds"] = statistics.median(cold)
    page_cache.warm(path)
    warm = []
    for _ in range(LOAD_REPS):
        start = time.perf_counter()
        load()
        warm.append(time.perf_counter() - start)
    out["warm_seconds"] = statistics.median(warm)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tool", choices=TOOLS)
    parser.add_argument("--scale", default="small", choices=sorted(workloads.LLAMA_SCALES))
    parser.add_argument("--root", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--drop-caches", action="store_true")
    args = parser.parse_args()
    shutil.rmtree(args.root, ignore_errors=True)
    record = {"tool": args.tool, "scale": args.scale,
              "base_bytes": sum(leaf.nbytes for leaf in base_leaves(args.scale)),
              "trainable_bytes": trainable_bytes(args.scale),
              "adapter_rank": adapter_rank(args.scale)}
    try:
        run = run_dcp if args.tool.startswith("dcp") else run_jax
        record.update(run(args.tool, args.scale, args.root, args.drop_caches), ok=True)
    except Exception:
        record.update(ok=False, error=traceback.format_exc())
    finally:
        shutil.rmtree(args.root, ignore_errors=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
