"""What the crash torture's writer saves, and how: shared by writer and checker.

Every value is derived from the step alone, so the checker can tell
bit-exactly whether a checkpoint holds the values of the step it is named
after. Sizes change with the step, so saves differ in files and calls.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkeep as sk

STEP_WIDTH = 6
# Small chunks: many storage calls per save, so many places to be killed.
# Comparing with the base links "embed" (equal values, a new numpy array
# at every step), so kills also hit saves that read the base to compare.
OPTIONS = sk.Options(chunk_bytes=16 << 10, timeout_s=60, compare_with_base=True)
# A forced replace rewrites the step compressed: other files, the same values.
REPLACE_OPTIONS = sk.Options(chunk_bytes=16 << 10, compression="zstd", timeout_s=60,
                             compare_with_base=True)


def manager(root: str, *, disk_full: bool = False) -> sk.CheckpointManager:
    """The manager every writer and the checker open on ``root``.

    keep_last=2 deletes a step at nearly every commit; keep_every_steps
    keeps some steps for good, so older checkpoints stay around to check.
    """
    if disk_full:
        return sk.CheckpointManager(root, keep_last=1, step_width=STEP_WIDTH, options=OPTIONS)
    return sk.CheckpointManager(root, keep_last=2, keep_every_steps=10, step_width=STEP_WIDTH,
                                options=OPTIONS)


def name(step: int) -> str:
    return f"{step:0{STEP_WIDTH}d}"


# "frozen" never changes: one jax.Array per writer process, so that each
# save after the writer's first links it from the step before (the manager
# reuses unchanged arrays), and kills hit saves and deletions of steps
# that others link.
FROZEN = np.linspace(-1, 1, 1 << 18, dtype=np.float32)  # 1 MiB: large enough to be linked
_frozen: list = []


def expected(step: int, *, scale: int = 1) -> dict:
    """The checkpointables of ``step``, as numpy values (what a load returns)."""
    rng = np.random.default_rng(step)
    n = scale * 2 * (1024 + (step * 7919) % 15000)  # even: "w" is split in two
    return {
        "params": {
            "frozen": FROZEN,
            "embed": FROZEN[::-1].copy(),
            "w": rng.standard_normal(n, dtype=np.float32),
            "b": (np.arange(64, dtype=np.int64) * step),
            "h": rng.integers(0, 2**16, size=(n // 4,), dtype=np.uint16),
        },
        "opt_state": {"count": np.int64(step), "mu": rng.standard_normal(257).astype(np.float64)},
        "data": {"step": step, "epoch": step // 7},
    }


def checkpointables(step: int, *, scale: int = 1) -> sk.Checkpointables:
    """What the writer saves for ``step``: ``expected`` with "w" a sharded jax.Array."""
    values = expected(step, scale=scale)
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    values["params"]["w"] = jax.device_put(jnp.asarray(values["params"]["w"]),
                                           NamedSharding(mesh, P("x")))
    if not _frozen:
        _frozen.append(jax.device_put(jnp.asarray(FROZEN), NamedSharding(mesh, P("x"))))
    values["params"]["frozen"] = _frozen[0]
    values["data"] = sk.JsonValue(values["data"])
    return sk.Checkpointables(values)


def differences(loaded: dict, step: int, *, scale: int = 1) -> list[str]:
    """Where ``loaded`` (a whole-checkpoint load) differs from ``expected(step)``."""
    want = expected(step, scale=scale)
    problems = []
    if set(loaded) != set(want):
        return [f"checkpointables {sorted(loaded)} != {sorted(want)}"]
    if loaded["data"] != want["data"]:
        problems.append(f"data {loaded['data']} != {want['data']}")
    for part in ("params", "opt_state"):
        for key, value in want[part].items():
            got = np.asarray(loaded[part].get(key))
            value = np.asarray(value)
            if got.dtype != value.dtype or got.shape != value.shape or \
                    got.tobytes() != value.tobytes():
                problems.append(f"{part}/{key} differs from step {step}'s values")
    return problems
