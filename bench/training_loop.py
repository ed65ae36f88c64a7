"""W6: how long a training loop stops for an asynchronous save.

A loop of updates, every few steps a tool's asynchronous save, then the
next update. Per save:

  blocking    the save call (until it hands control back)
  step_after  the first update after it, while the save writes in the background
  baseline    the median update away from saves (after the previous save finished)
  slowdown    max(0, step_after - baseline)
  stall       blocking + slowdown

The first save warms the tool up; saves 2 to SAVES count. JAX tools update
with a jitted function that donates its input (as a training step does),
so a tool that kept references to the arrays instead of copying them pays
in the next step, not in its blocking phase. DCP updates its tensors in
place right after the blocking phase returns. After the loop the last
checkpoint is loaded and compared with copies of a few leaves taken just
before its save call: a tool that saved values of a later step is reported
as unverified, not as fast.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import statistics
import time
import warnings

import tools
import workloads

# op: the workload whose state the loop trains.
STATE_OF = {"stall": "W1", "stall_small": "W2"}
WARMUP_STEPS = 3
SETTLE_STEPS = 2  # untimed after a save finished, so that baseline steps are clean
BASELINE_STEPS = 3  # timed before each save
SAVES = 4
FIRST_COUNTED = 1  # the first save warms the tool up


def run(tool, op: str, scale: str, folder: str, reset_peak_rss, status_kib) -> dict:
    """Measures ``tool`` in the loop on ``op``'s state; checkpoints go under
    ``folder`` and are removed once the next one is committed.
    ``status_kib(field)`` reads a field of /proc/self/status."""
    workload = STATE_OF[op]
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    loop = (TorchLoop if tool.framework == "torch" else JaxLoop)(tool, workload, scale)
    tool.prepare("async_save")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(WARMUP_STEPS):
            loop.step()
        _return_freed_memory()
        loop_rss = status_kib("VmRSS")
        reset_peak_rss()
        baseline, saves, expected, path = run_loop(tool, loop, folder)
        peak = status_kib("VmHWM")
        loop.release()
        target = tools.target_for(tool, workload, scale, "fsdp")
        verified = loop.matches(tool.load(path, target), expected)
    tool.close()
    shutil.rmtree(folder, ignore_errors=True)
    return summary(baseline, saves) | {
        "state": workload, "bytes": workloads.state_bytes(workload, scale),
        "peak_rss_kib": peak, "loop_rss_kib": loop_rss, "verified": verified,
        "warnings": sorted({str(w.message)[:300] for w in caught})}


def _return_freed_memory() -> None:
    """Hands the memory freed by the update's compilation back to the
    kernel (glibc keeps it otherwise: some 1.7 GB for W2's 2,000 leaves),
    so that peak RSS shows the state and the save, not the compiler."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def run_loop(tool, loop, folder, save_count: int = SAVES):
    """The training loop; returns the plain steps' times, each save's
    times, the leaves as of the last save call and that checkpoint's path."""
    baseline, saves, previous = [], [], None
    for i in range(save_count):
        for _ in range(SETTLE_STEPS if i else 0):
            loop.step()
        for _ in range(BASELINE_STEPS):
            baseline.append(_timed(loop.step))
        expected = loop.snapshot()
        path = os.path.join(folder, f"save_{i}")
        start = time.perf_counter()
        wait = tool.save_async(path, loop.state)
        blocking = time.perf_counter() - start
        step_after = _timed(loop.step)
        wait()
        saves.append({"blocking": blocking, "step_after": step_after,
                      "total": time.perf_counter() - start})
        if previous is not None:
            shutil.rmtree(previous)
        previous = path
    return baseline, saves, expected, previous


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def summary(baseline: list[float], saves: list[dict]) -> dict:
    base = statistics.median(baseline)
    for s in saves:
        s["slowdown"] = max(0.0, s["step_after"] - base)
        s["stall"] = s["blocking"] + s["slowdown"]
    counted = saves[FIRST_COUNTED:]

    def med(key):
        return statistics.median(s[key] for s in counted)

    return {"seconds": med("stall"), "blocking_seconds": med("blocking"),
            "step_after_seconds": med("step_after"), "slowdown_seconds": med("slowdown"),
            "total_seconds": med("total"), "baseline_step_seconds": base,
            "baseline_steps": baseline, "saves": saves}


def check_paths(workload: str, scale: str) -> list[tuple[str, ...]]:
    """The leaves compared after the loop: a bfloat16 and a float32 one
    (W1: a parameter and an Adam moment, plus the step), W2's first and last."""
    leaves = workloads.leaves(workload, scale)
    if workload == "W2":
        return [leaves[0].path, leaves[-1].path]
    return [leaves[1].path, leaves[len(leaves) // 2 + 1].path, ("step",)]


def get_leaf(tree, path):
    for key in path:
        tree = tree[key]
    return tree


class JaxLoop:
    """The state as jax.Arrays; the update is jitted, donates its input and
    keeps every leaf's sharding."""

    def __init__(self, tool, workload: str, scale: str, state=None):
        """``state``: the workload's state, built elsewhere (bench/gpu.py
        makes it on the accelerator); by default the suite's own."""
        import jax
        self.jax = jax
        self.state = jax.block_until_ready(
            tools.state_for(tool, workload, scale) if state is None else state)
        shardings = jax.tree.map(lambda x: x.sharding, self.state)
        self._update = jax.jit(_jax_update, donate_argnums=0, out_shardings=shardings)
        self.paths = check_paths(workload, scale)

    def step(self):
        self.state = self.jax.block_until_ready(self._update(self.state))

    def snapshot(self) -> dict:
        """Device copies of the checked leaves (np.asarray of a live leaf
        would keep a view of its buffer, which changes what donation does)."""
        import jax.numpy as jnp
        return self.jax.block_until_ready(
            {path: jnp.copy(get_leaf(self.state, path)) for path in self.paths})

    def release(self):
        self.state = None

    def matches(self, loaded, expected: dict) -> bool:
        import numpy as np
        return all(np.asarray(get_leaf(loaded, path)).tobytes() == np.asarray(value).tobytes()
                   for path, value in expected.items())


def _jax_update(state):
    import jax
    import jax.numpy as jnp

    def one(x):
        if jnp.issubdtype(x.dtype, jnp.integer):
            return x + 1
        return (x * 0.999 + 0.001).astype(x.dtype)
    return jax.tree.map(one, state)


class TorchLoop:
    """The state as a torch state_dict, updated in place."""

    def __init__(self, tool, workload: str, scale: str, state=None):
        import torch
        self.torch = torch
        self.state = tools.state_for(tool, workload, scale) if state is None else state
        self.tensors = list(tensors(self.state))
        self.on_gpu = any(t.is_cuda for t in self.tensors)
        self.paths = check_paths(workload, scale)

    def step(self):
        with self.torch.no_grad():
            for t in self.tensors:
                if t.is_floating_point():
                    t.mul_(0.999).add_(0.001)
                else:
                    t.add_(1)
        if self.on_gpu:  # the kernels run after the launches return
            self.torch.cuda.synchronize()

    def snapshot(self) -> dict:
        return {path: get_leaf(self.state, path).clone() for path in self.paths}

    def release(self):
        self.state, self.tensors = None, []

    def matches(self, loaded, expected: dict) -> bool:
        return all(self.torch.equal(get_leaf(loaded, path), value)
                   for path, value in expected.items())


def tensors(tree):
    """The leaves of a nested dict of tensors, in its order."""
    if isinstance(tree, dict):
        for value in tree.values():
            yield from tensors(value)
    else:
        yield tree
