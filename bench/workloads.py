"""The benchmark's states: one definition, built as JAX pytrees or torch state_dicts.

W1 is a Llama-style training state: bfloat16 parameters plus float32 Adam
moments (mu, nu) of the same shapes, a few hundred leaves, FSDP-sharded
over 8 devices (first dimension split 8 ways). W2 is 2,000 small float32
leaves of 1-64 KiB. W3 is W1 on tmpfs; W4 is W1 in a 2-process job; W5
is W1 on an S3 server. W7 is a bfloat16 model (W1's parameter shapes,
six times as many layers) in Hugging Face-style safetensors files.

Values are deterministic per leaf (seeded by its position), so every tool
saves identical bytes.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

# name: (hidden, mlp, vocab, layers). Every extent is divisible by 8.
LLAMA_SCALES = {
    "tiny": (128, 352, 2048, 16),      # ~40 MiB state, for smoke tests
    "small": (320, 896, 8192, 16),     # ~245 MiB
    "full": (1344, 3584, 32000, 16),   # ~4.0 GiB
    "gpu": (2944, 7808, 32000, 16),    # ~16.3 GiB, one accelerator's state (bench/gpu.py)
}
SMALL_LEAF_COUNT = 2000
# W7: W1's parameter shapes with this many times its layers, bfloat16 only,
# so that the full scale holds ~4 GiB of parameters (tiny ~40 MiB, small ~245 MiB).
MODEL_LAYER_FACTOR = 6


@dataclasses.dataclass(frozen=True)
class Leaf:
    path: tuple[str, ...]  # key path in the nested dict
    shape: tuple[int, ...]
    dtype: str            # numpy / ml_dtypes name
    seed: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(_np_dtype(self.dtype)).itemsize


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(name)


def llama_param_shapes(scale: str, layer_factor: int = 1
                       ) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    d, f, vocab, layers = LLAMA_SCALES[scale]
    layers *= layer_factor
    shapes = [(("embed", "embedding"), (vocab, d))]
    for i in range(layers):
        layer = f"layers_{i}"
        shapes += [
            ((layer, "attn", "q_proj"), (d, d)),
            ((layer, "attn", "k_proj"), (d, d)),
            ((layer, "attn", "v_proj"), (d, d)),
            ((layer, "attn", "o_proj"), (d, d)),
            ((layer, "mlp", "gate_proj"), (d, f)),
            ((layer, "mlp", "up_proj"), (d, f)),
            ((layer, "mlp", "down_proj"), (f, d)),
            ((layer, "input_norm", "scale"), (d,)),
            ((layer, "post_attn_norm", "scale"), (d,)),
        ]
    shapes += [(("final_norm", "scale"), (d,)), (("lm_head", "kernel"), (d, vocab))]
    return shapes


def leaves(workload: str, scale: str) -> list[Leaf]:
    """The array leaves of a workload, in a fixed order."""
    if workload in ("W1", "W3", "W4", "W5", "W10"):
        out = []
        for group, dtype in (("params", "bfloat16"), ("mu", "float32"), ("nu", "float32")):
            prefix = ("params",) if group == "params" else ("opt_state", group)
            for path, shape in llama_param_shapes(scale):
                out.append(Leaf(prefix + path, shape, dtype, len(out)))
        return out
    if workload == "W7":
        return [Leaf(path, shape, "bfloat16", i) for i, (path, shape)
                in enumerate(llama_param_shapes(scale, MODEL_LAYER_FACTOR))]
    if workload == "W2":
        rng = np.random.default_rng(2)
        out = []
        for i in range(SMALL_LEAF_COUNT):
            elems = int(rng.integers(256, 16 * 1024 + 1))  # 1-64 KiB of float32
            out.append(Leaf((f"block_{i // 20}", f"leaf_{i % 20}"), (elems,), "float32", i))
        return out
    raise ValueError(f"unknown workload {workload!r}")


def state_bytes(workload: str, scale: str) -> int:
    return sum(leaf.nbytes for leaf in leaves(workload, scale))


def leaf_values(leaf: Leaf, rows: slice | None = None) -> np.ndarray:
    """The leaf's values (or rows of them), deterministic from its seed.

    Values are generated in blocks of one eighth of the rows, each from its
    own seed, so any sharding of the first dimension (and each process of a
    multi-process job) builds exactly the same bytes.
    """
    shape = leaf.shape
    start, stop = (0, shape[0]) if rows is None else (rows.start, rows.stop)
    block = shape[0] // 8 if shape[0] % 8 == 0 else shape[0]
    inner = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    parts = []
    for first in range(start - start % block, stop, block):
        rng = np.random.default_rng([leaf.seed, first])
        values = rng.standard_normal(block * inner, dtype=np.float32)
        values *= 0.02
        lo, hi = max(start, first) - first, min(stop, first + block) - first
        parts.append(values[lo * inner:hi * inner])
    values = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return values.reshape((stop - start,) + tuple(shape[1:])).astype(_np_dtype(leaf.dtype))


def tensor_name(leaf: Leaf) -> str:
    """W7: the leaf's tensor name in the safetensors files, its keys joined
    by "." (shardkeep.load_safetensors' default mapping)."""
    return ".".join(leaf.path)


def nest(items: list[tuple[tuple[str, ...], object]]) -> dict:
    root: dict = {}
    for path, value in items:
        node = root
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return root


# --- JAX -------------------------------------------------------------------

def fsdp_mesh():
    import jax
    from jax.sharding import Mesh
    return Mesh(np.array(jax.devices()), ("fsdp",))


def tp_mesh():
    import jax
    from jax.sharding import Mesh
    return Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))


def sharding_for(workload: str, leaf: Leaf, layout: str):
    """layout "fsdp": first dimension over all devices; "tp": (2,4) mesh,
    first dimension over "data" (FSDP), last over "model" (tensor)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    if workload == "W2":
        return jax.sharding.SingleDeviceSharding(jax.devices()[0])
    if layout == "fsdp":
        return NamedSharding(fsdp_mesh(), P("fsdp"))
    if len(leaf.shape) == 1:
        return NamedSharding(tp_mesh(), P("model"))
    return NamedSharding(tp_mesh(), P("data", "model"))


def jax_state(workload: str, scale: str):
    """The state as jax.Arrays (built leaf by leaf, so host memory peaks at
    the state plus one leaf)."""
    import jax
    items = []
    for leaf in leaves(workload, scale):
        sharding = sharding_for(workload, leaf, "fsdp")
        items.append((leaf.path, jax.make_array_from_callback(
            leaf.shape, sharding, lambda index, leaf=leaf: _block(leaf, index))))
    return _with_step(workload, nest(items), 1000)


def _block(leaf: Leaf, index: tuple[slice, ...]) -> np.ndarray:
    rows = slice(*index[0].indices(leaf.shape[0]))
    return leaf_values(leaf, rows)[(slice(None),) + tuple(index[1:])]


def jax_target(workload: str, scale: str, layout: str):
    import jax
    items = [(leaf.path, jax.ShapeDtypeStruct(leaf.shape, _np_dtype(leaf.dtype),
                                              sharding=sharding_for(workload, leaf, layout)))
             for leaf in leaves(workload, scale)]
    return _with_step(workload, nest(items), jax.ShapeDtypeStruct((), np.int32))


def _with_step(workload: str, tree: dict, step):
    """Adds the step counter as a replicated global array (a process-local
    scalar cannot be saved by a multi-process job)."""
    if workload not in ("W2", "W7"):
        import jax
        from jax.sharding import NamedSharding, PartitionSpec as P
        replicated = NamedSharding(fsdp_mesh(), P())
        if isinstance(step, int):
            step = jax.make_array_from_callback((), replicated,
                                                lambda index: np.asarray(step, np.int32))
        else:
            step = jax.ShapeDtypeStruct((), np.int32, sharding=replicated)
        tree["step"] = step
    return tree


# --- torch -----------------------------------------------------------------

def torch_rows(workload: str, leaf: Leaf) -> slice | None:
    """This process's rows of a leaf: in W4 (a torch.distributed job) the
    first dimension is split evenly over the ranks, as FSDP shards it;
    elsewhere one process holds everything (None)."""
    if workload != "W4":
        return None
    import torch.distributed as dist
    rows = leaf.shape[0] // dist.get_world_size()
    return slice(dist.get_rank() * rows, (dist.get_rank() + 1) * rows)


def _torch_leaf(workload: str, leaf: Leaf, local):
    """W4: this rank's rows as a DTensor sharded over a 1-D mesh of all
    ranks (Shard(0)); global shape and stride are given, so building it
    needs no communication. Elsewhere the plain tensor."""
    if workload != "W4":
        return local
    import torch
    from torch.distributed.tensor import DTensor, Shard
    return DTensor.from_local(local, _torch_mesh(), [Shard(0)], shape=torch.Size(leaf.shape),
                              stride=torch.empty(leaf.shape, device="meta").stride())


def start_dtensor() -> None:
    """Starts DTensor's runtime: the mesh, and a first DTensor (its first use
    loads some 30 MiB of code), so a runtime RSS baseline includes them."""
    import torch
    from torch.distributed.tensor import DTensor, Shard
    DTensor.from_local(torch.zeros(1), _torch_mesh(), [Shard(0)])


@functools.cache
def _torch_mesh():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (dist.get_world_size(),))


def torch_state(workload: str, scale: str) -> dict:
    """The state as a nested state_dict; in W4 each rank builds only its own
    rows (DTensors), as a DCP user's FSDP model would hold them."""
    import torch
    items = []
    for leaf in leaves(workload, scale):
        values = leaf_values(leaf, torch_rows(workload, leaf))
        if leaf.dtype == "bfloat16":
            tensor = torch.from_numpy(values.view(np.uint16)).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(values)
        items.append((leaf.path, _torch_leaf(workload, leaf, tensor)))
    tree = nest(items)
    if workload != "W2":
        # A plain tensor on every rank: DCP treats it as replicated, one copy saved.
        tree["step"] = torch.tensor(1000, dtype=torch.int32)
    return tree


def torch_target(workload: str, scale: str) -> dict:
    import torch
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    items = []
    for leaf in leaves(workload, scale):
        rows = torch_rows(workload, leaf)
        shape = leaf.shape if rows is None else (rows.stop - rows.start,) + leaf.shape[1:]
        local = torch.empty(shape, dtype=dtypes[leaf.dtype])
        items.append((leaf.path, _torch_leaf(workload, leaf, local)))
    tree = nest(items)
    if workload != "W2":
        tree["step"] = torch.tensor(0, dtype=torch.int32)
    return tree
