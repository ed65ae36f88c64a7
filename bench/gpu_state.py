"""bench/gpu.py's state: W1's leaves (bfloat16 parameters, float32 Adam
moments, a step), made on the accelerator itself.

The suite builds W1 on the host from seeded numpy draws; 16 GiB of them
would take minutes of one core on the device machine, whose minutes are
few. So each leaf is drawn on the device (JAX's or torch's generator,
seeded by the leaf's position). The two frameworks' states hold different
values of the same shapes and dtypes: every tool saves and loads the same
number of bytes, and each is checked against its own state.
"""

from __future__ import annotations

import functools

import numpy as np

import workloads

WORKLOAD = "W1"
STEP = 1000


def leaves(scale: str) -> list[workloads.Leaf]:
    return workloads.leaves(WORKLOAD, scale)


def state_bytes(scale: str) -> int:
    return workloads.state_bytes(WORKLOAD, scale)


# --- JAX -------------------------------------------------------------------

def _sharding():
    """Every leaf whole on the first device: one accelerator's state."""
    import jax
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


@functools.cache
def _draw(shape: tuple[int, ...], dtype: str):
    import jax
    import jax.numpy as jnp

    def draw(seed):
        values = jax.random.normal(jax.random.key(seed), shape, jnp.float32) * 0.02
        return values.astype(workloads._np_dtype(dtype))
    return jax.jit(draw, out_shardings=_sharding())


def jax_state(scale: str) -> dict:
    import jax
    import jax.numpy as jnp
    items = [(leaf.path, _draw(leaf.shape, leaf.dtype)(leaf.seed)) for leaf in leaves(scale)]
    tree = workloads.nest(items)
    tree["step"] = jax.device_put(jnp.asarray(STEP, jnp.int32), _sharding())
    return jax.block_until_ready(tree)


def jax_target(scale: str) -> dict:
    import jax
    items = [(leaf.path, jax.ShapeDtypeStruct(leaf.shape, workloads._np_dtype(leaf.dtype),
                                              sharding=_sharding()))
             for leaf in leaves(scale)]
    tree = workloads.nest(items)
    tree["step"] = jax.ShapeDtypeStruct((), np.int32, sharding=_sharding())
    return tree


def jax_equal(loaded: dict, expected: dict) -> bool:
    """Every leaf bit for bit, compared on the device."""
    import jax
    import jax.numpy as jnp
    pairs = zip(jax.tree.leaves(loaded), jax.tree.leaves(expected))
    return all(a.shape == b.shape and a.dtype == b.dtype
               and bool(jnp.array_equal(a.view(_same_width_int(a.dtype)),
                                        b.view(_same_width_int(b.dtype))))
               for a, b in pairs)


def _same_width_int(dtype):
    """Compared as integers of the same width: NaN == NaN, -0 != +0."""
    return {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[np.dtype(dtype).itemsize]


# --- torch -----------------------------------------------------------------

def torch_device():
    import torch
    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def torch_state(scale: str) -> dict:
    import torch
    device = torch_device()
    generator = torch.Generator(device=device)
    items = []
    for leaf in leaves(scale):
        generator.manual_seed(leaf.seed)
        tensor = torch.empty(leaf.shape, dtype=getattr(torch, leaf.dtype), device=device)
        items.append((leaf.path, tensor.normal_(0.0, 0.02, generator=generator)))
    tree = workloads.nest(items)
    tree["step"] = torch.tensor(STEP, dtype=torch.int32, device=device)
    synchronize()
    return tree


def torch_target(scale: str) -> dict:
    """Tensors to load into (DCP loads in place), on the accelerator."""
    import torch
    device = torch_device()
    items = [(leaf.path, torch.empty(leaf.shape, dtype=getattr(torch, leaf.dtype), device=device))
             for leaf in leaves(scale)]
    tree = workloads.nest(items)
    tree["step"] = torch.tensor(0, dtype=torch.int32, device=device)
    return tree


def torch_flat(tree: dict, prefix: str = "") -> dict:
    """{dotted name: tensor}, as a safetensors file holds them."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= torch_flat(value, name + ".")
        else:
            out[name] = value
    return out


def torch_equal(loaded: dict, expected: dict) -> bool:
    import torch
    got, want = torch_flat(loaded), torch_flat(expected)
    return got.keys() == want.keys() and all(
        got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
        and torch.equal(got[k].to(want[k].device), want[k]) for k in want)


def synchronize() -> None:
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# --- either ----------------------------------------------------------------

def target_for(framework: str, scale: str) -> dict:
    """What a tool of ``framework`` ("jax" or "torch") loads into."""
    return torch_target(scale) if framework == "torch" else jax_target(scale)


def equal(framework: str, loaded: dict, expected: dict) -> bool:
    return (torch_equal if framework == "torch" else jax_equal)(loaded, expected)
