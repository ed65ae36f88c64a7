"""Trains the demo model with a CheckpointManager, resuming from the latest checkpoint.

    python examples/demo/train.py --root CKPTS --steps 200 --losses losses.txt

Each checkpoint holds three checkpointables: "params", "opt_state" and
"data" (the data loader's position, as JSON). Every step's loss is appended
to ``--losses`` as ``<step> <float32 bits in hex>`` so another process can
compare runs bit for bit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

if __name__ == "__main__":  # 8 CPU devices unless the caller chose otherwise.
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardkeep as sk

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402

HELD_OUT = 1000  # seed offset of the evaluation batches
EVAL_BATCHES = 4


def abstract(tree):
    """Shapes, dtypes and shardings of ``tree``: the target of a load."""
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                        tree)


def loss_bits(loss) -> str:
    return np.asarray(loss, np.float32).tobytes().hex()


def eval_loss(config: model.Config, params, mesh) -> float:
    """Mean loss over the held-out batches, on ``mesh``."""
    evaluate = model.make_eval(config)
    sharding = NamedSharding(mesh, P("data", None))
    losses = [evaluate(params, jax.device_put(model.batch(config, i, seed_offset=HELD_OUT),
                                              sharding))
              for i in range(EVAL_BATCHES)]
    return float(np.mean([np.asarray(x) for x in losses]))


def train(config: model.Config, root: str, *, steps: int, save_every: int,
          mesh_shape=(2, 4), stop_after: int | None = None, losses_path: str | None = None,
          log=print) -> tuple[dict[int, str], dict]:
    """Trains until ``steps`` updates are done, resuming from ``root``'s latest checkpoint.

    Returns {step: loss bits} of the steps this call ran, and the final state.
    ``stop_after`` ends the run after that step without finishing (a crash
    in a test; the demo uses SIGKILL).
    """
    mesh = model.make_mesh(mesh_shape)
    fresh = model.init_state(config, mesh)
    state_shardings = jax.tree.map(lambda a: a.sharding, fresh)
    batch_sharding = NamedSharding(mesh, P("data", None))
    train_step = model.make_train_step(config, state_shardings, batch_sharding)
    losses = {}
    out = open(losses_path, "a", encoding="ascii") if losses_path else None
    with sk.CheckpointManager(root, save_interval_steps=save_every, keep_last=3, keep_best=1,
                              best_metric="loss") as mgr:
        start = mgr.latest_step()
        if start is None:
            state, start = fresh, 0
            log("no checkpoint yet: training from scratch")
        else:
            began = time.perf_counter()
            target = sk.Checkpointables(params=abstract(fresh["params"]),
                                        opt_state=abstract(fresh["opt_state"]), data=None)
            restored = dict(mgr.load(start, target))
            data = restored.pop("data")
            assert data["next_step"] == start, data
            state = restored
            log(f"resumed from checkpoint {mgr.step_path(start)}: step {start}, data position"
                f" {data['next_step']}, loaded in {time.perf_counter() - began:.2f} s"
                f" (checkpoints present: {mgr.all_steps()})")
        del fresh
        timer = time.perf_counter()
        for step in range(start, steps):
            if step == start + 1:  # Time the steady state, after the compiling first step.
                timer = time.perf_counter()
            tokens = jax.device_put(model.batch(config, step), batch_sharding)
            state, loss = train_step(state, tokens)
            losses[step] = loss_bits(loss)
            if out:
                out.write(f"{step} {losses[step]}\n")
                out.flush()
            done = step + 1
            if step == start:
                log(f"step {step} loss {float(loss):.4f} (first step, with JIT compilation)")
            else:
                log(f"step {step} loss {float(loss):.4f}"
                    f" ({(time.perf_counter() - timer) / (step - start) * 1e3:.0f} ms/step)")
            save_began = time.perf_counter()
            items = sk.Checkpointables(state, data=sk.JsonValue({"next_step": done,
                                                                 "seed": config.seed}))
            if mgr.save(done, items, metrics={"loss": loss}, force=done == steps):
                log(f"saving step {done}: training blocked"
                    f" {(time.perf_counter() - save_began) * 1e3:.1f} ms")
            if stop_after is not None and step == stop_after:
                break
        mgr.wait()
        log(f"checkpoints kept: {mgr.all_steps()}, best by loss: {mgr.best_step()}")
    if out:
        out.close()
    return losses, state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="checkpoint directory")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=20)
    parser.add_argument("--losses", required=True, help="file the step losses are appended to")
    parser.add_argument("--eval-out", help="JSON file for the final held-out loss")
    args = parser.parse_args()
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="shardkeep: %(message)s")
    logging.getLogger("jax").setLevel(logging.WARNING)
    config = model.Config()

    def log(line):  # One write per line, so lines of the manager's thread do not cut in.
        print(line + "\n", end="", flush=True)

    _, state = train(config, args.root, steps=args.steps, save_every=args.save_every,
                     losses_path=args.losses, log=log)
    if args.eval_out:
        value = eval_loss(config, state["params"], model.make_mesh((2, 4)))
        with open(args.eval_out, "w", encoding="ascii") as f:
            json.dump({"step": args.steps, "eval_loss": value}, f)
        log(f"held-out loss of the trained params: {value:.6f}")


if __name__ == "__main__":
    main()
