"""The per-leaf costs of a 2,000-leaf tree (W2's shape) inside one process:
planning a save and encoding its meta.json (a first save, then a save whose
scalar changed), and a warm load and sk.metadata of the saved checkpoint.
Each figure is the minimum of REPS runs, which machine noise can only make
larger: a check that a change to per-leaf Python or binding code costs
nothing, run once per build in alternation (PYTHONPATH=<baseline build>
for the build before), when the suite's wall-clock figures are too noisy.

    python bench/tree_overheads.py LABEL [--root DIR]
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import shardkeep as sk
from shardkeep.saving import staging

REPS = 10


def _tree() -> dict:
    rng = np.random.default_rng(0)
    tree: dict = {f"layer{i}": jnp.asarray(rng.standard_normal(int(rng.integers(256, 16384)),
                                                               dtype=np.float32))
                  for i in range(2000)}
    tree["step"] = 0
    return tree


def _minimum(run) -> float:
    return min(_timed(run) for _ in range(REPS))


def _timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("label")
    parser.add_argument("--root", default="/tmp/shardkeep-tree-overheads")
    args = parser.parse_args()
    tree = _tree()

    def first_save_plan():
        staging._plans.clear()  # noqa: SLF001 - a first save plans afresh
        plan, values = staging.plan_pytree(tree, False)
        plan.meta_json_for(values)

    def changed_scalar_plan():
        tree["step"] += 1  # the plan is kept; its meta.json is encoded again
        plan, values = staging.plan_pytree(tree, False)
        plan.meta_json_for(values)

    path = os.path.join(args.root, args.label)
    if not os.path.exists(path):
        sk.save(path, tree)
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
                          if isinstance(a, jax.Array) else a, tree)
    figures = {"first save's plan + meta.json": _minimum(first_save_plan),
               "later save's plan + meta.json": _minimum(changed_scalar_plan),
               "warm load": _minimum(lambda: sk.load(path, target)),
               "sk.metadata": _minimum(lambda: sk.metadata(path))}
    print(args.label + ": " + ", ".join(f"{name} {s * 1e3:.1f} ms" for name, s in figures.items()))


if __name__ == "__main__":
    main()
