"""The shardkeep demo: train, get killed, resume exactly, evaluate elsewhere.

    python examples/demo/main.py [--steps 200] [--save-every 20] [--seed N]

1. Trains the demo transformer (examples/demo/model.py) uninterrupted in a
   child process: the reference losses.
2. Trains it again from scratch in a child, with asynchronous checkpoints
   every --save-every steps, and kills that child with SIGKILL at a random
   step (chosen from --seed, printed).
3. Restarts the child: it resumes from the latest committed checkpoint and
   finishes. Its losses must equal the reference's bit for bit.
4. Loads only the params of the final checkpoint onto a (4, 2) mesh with
   another sharding, as an evaluation job would, and prints the held-out loss.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

import shardkeep as sk  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model  # noqa: E402
import train  # noqa: E402


def run_child(label: str, root: str, losses: str, args, *, kill_at: int | None = None,
              eval_out: str | None = None) -> int | None:
    """Runs train.py; shows its progress; kills it after step ``kill_at``.

    Returns the step after which it was killed, or None if it finished.
    """
    command = [sys.executable, "-u", os.path.join(HERE, "train.py"), "--root", root,
               "--steps", str(args.steps), "--save-every", str(args.save_every),
               "--losses", losses]
    if eval_out:
        command += ["--eval-out", eval_out]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    killed = None
    try:
        for line in child.stdout:
            words = line.split()
            step = int(words[1]) if words[:1] == ["step"] else None
            if step is None or step % args.save_every == 0 or step == kill_at:
                print(f"  [{label}] {line.rstrip()}", flush=True)
            if kill_at is not None and step == kill_at:
                child.send_signal(signal.SIGKILL)
                killed = step
                break
        child.wait(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if killed is None and child.returncode != 0:
        sys.exit(f"FAILED: the {label} run exited with status {child.returncode}")
    return killed


def read_losses(path: str) -> dict[int, str]:
    """{step: float32 bits}; a line cut short by the kill is ignored."""
    losses = {}
    with open(path, encoding="ascii") as f:
        for line in f:
            words = line.split()
            if len(words) == 2 and len(words[1]) == 8:
                losses[int(words[0])] = words[1]
    return losses


def as_float(bits: str) -> float:
    return float(np.frombuffer(bytes.fromhex(bits), np.float32)[0])


def evaluate(root: str, config: model.Config) -> tuple[int, float]:
    """Loads only "params" of the latest checkpoint onto a (4, 2) mesh and evaluates."""
    mesh = model.make_mesh((4, 2))
    shapes = jax.eval_shape(functools.partial(model.init_params, config))
    specs = model.param_specs(shapes, transposed=True)
    target = jax.tree.map(
        lambda s, spec: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                             sharding=NamedSharding(mesh, spec)),
        shapes, specs)
    with sk.CheckpointManager(root) as mgr:
        step = mgr.latest_step()
        info = sk.metadata(mgr.step_path(step))
        began = time.perf_counter()
        params = mgr.load(step, sk.Checkpointables(params=target))["params"]
        took = time.perf_counter() - began
    size = sum(leaf.bytes for leaf in info.checkpointables["params"].leaves)
    print(f"  loaded checkpointable 'params' of step {step} ({size / 2**20:.2f} MiB) in"
          f" {took:.2f} s; not read: {sorted(set(info.checkpointables) - {'params'})}")
    saved = next(leaf.sharding for leaf in info.checkpointables["params"].leaves
                 if leaf.path == "layer_0/qkv")
    print(f"  layer_0/qkv: saved with spec {tuple(saved['spec'])} on mesh"
          f" {tuple(saved['mesh_shape'])}, loaded with spec"
          f" {tuple(params['layer_0']['qkv'].sharding.spec)} on mesh {tuple(mesh.shape.values())}")
    return step, train.eval_loss(config, params, mesh)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=20)
    parser.add_argument("--seed", type=int, help="picks the kill step (default: random)")
    parser.add_argument("--workdir", help="where runs are written (default: a temporary dir)")
    args = parser.parse_args()
    began = time.perf_counter()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    kill_at = random.Random(seed).randrange(args.save_every + 5, args.steps - args.save_every)
    workdir = args.workdir or tempfile.mkdtemp(prefix="shardkeep-demo-")
    os.makedirs(workdir, exist_ok=True)
    ref_root, root = os.path.join(workdir, "reference"), os.path.join(workdir, "run")
    ref_losses, losses_before, losses_after = (os.path.join(workdir, name) for name in (
        "reference.losses", "killed.losses", "resumed.losses"))
    ref_eval, run_eval = os.path.join(workdir, "reference.eval"), os.path.join(workdir, "run.eval")
    config = model.Config()
    print(f"shardkeep demo: {config.layers}-layer transformer (d_model {config.d_model}, vocab"
          f" {config.vocab}, seq {config.seq}, batch {config.batch}), AdamW, mesh (2, 4) over"
          f" {jax.device_count()} {jax.devices()[0].platform} devices; {args.steps} steps,"
          f" async checkpoint every {args.save_every}, keep_last=3, keep_best=1 by loss")
    print(f"workdir {workdir}; seed {seed}: SIGKILL after step {kill_at}\n")

    print("1/4 uninterrupted reference run", flush=True)
    run_child("reference", ref_root, ref_losses, args, eval_out=ref_eval)

    print(f"\n2/4 the same training, killed with SIGKILL after step {kill_at}", flush=True)
    run_child("killed", root, losses_before, args, kill_at=kill_at)
    print(f"  on disk after the kill: {sorted(os.listdir(root))}")

    print("\n3/4 restart: resume from the latest committed checkpoint", flush=True)
    run_child("resumed", root, losses_after, args, eval_out=run_eval)

    reference, before, after = (read_losses(p) for p in (ref_losses, losses_before,
                                                         losses_after))
    resumed_at = min(after)
    mismatches = [s for s in sorted({**before, **after}) if
                  {**before, **after}[s] != reference[s]]
    ends = [after[s] == reference[s] for s in after]
    print(f"  resumed at step {resumed_at}; compared {len(after)} losses after the resume and"
          f" {len(before)} before the kill with the reference, bit for bit:"
          f" {'identical' if not mismatches and all(ends) else f'{len(mismatches)} differ'}")
    print(f"  loss at step {args.steps - 1}: reference {as_float(reference[args.steps - 1]):.6f},"
          f" resumed {as_float(after[args.steps - 1]):.6f}")
    if mismatches or set(after) != set(range(resumed_at, args.steps)):
        sys.exit(f"FAILED: losses differ from the reference at steps {mismatches[:10]}")

    print("\n4/4 evaluation job: only the params, on a (4, 2) mesh with another sharding",
          flush=True)
    step, eval_loss = evaluate(root, config)
    with open(run_eval, encoding="ascii") as f:
        trained = json.load(f)["eval_loss"]
    print(f"  held-out loss at step {step}: {eval_loss:.6f} (the training job measured"
          f" {trained:.6f} on its own mesh)")
    if step != args.steps or not np.isclose(eval_loss, trained, rtol=1e-4):
        sys.exit("FAILED: the evaluation job does not see the trained params")
    print(f"\nSUCCESS: killed after step {kill_at}, resumed from step {resumed_at}; the"
          f" {len(after)} losses after the resume equal the uninterrupted run's bit for bit;"
          f" params-only evaluation on a (4, 2) mesh: held-out loss {eval_loss:.4f}"
          f" ({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
