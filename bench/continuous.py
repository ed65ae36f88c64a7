"""Continuous saving in W6's training loop, shardkeep beside Orbax.

Each tool's manager saves with ``ContinuousCheckpointingPolicy`` and the
same minimum interval (a new save as soon as the last one has committed,
no sooner than the interval after it started) while the loop of W6 (a
jitted update that donates the W1 state) runs for a fixed time. A loop
without checkpoints runs beside them as the reference. Every tool runs in
a fresh process, the order alternating between repetitions (the first to
touch fresh arrays in a process pays JAX's per-device array creation).

Reported per tool: steps per second, the throughput lost against the loop
without checkpoints, how many checkpoints committed, and the median number
of steps between consecutive committed checkpoints.

    python bench/continuous.py --scale small --seconds 30 --interval 2 --reps 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = ("none", "shardkeep", "orbax")


def _loop(tool: str, scale: str, seconds: float, interval: float, folder: str) -> dict:
    import jax

    sys.path.insert(0, HERE)
    import training_loop
    import workloads

    state = jax.block_until_ready(workloads.jax_state("W1", scale))
    shardings = jax.tree.map(lambda x: x.sharding, state)
    update = jax.jit(training_loop._jax_update, donate_argnums=0, out_shardings=shardings)
    for _ in range(3):  # compile and warm up
        state = jax.block_until_ready(update(state))
    save, finish = _manager(tool, folder, interval)
    saved_at = []
    steps = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        steps += 1
        state = jax.block_until_ready(update(state))
        if save(steps, state):
            saved_at.append(steps)
    elapsed = time.perf_counter() - started
    finish()  # every started save committed, or this raised
    gaps = [b - a for a, b in zip(saved_at, saved_at[1:])]
    return {"tool": tool, "steps": steps, "seconds": elapsed, "steps_per_s": steps / elapsed,
            "committed": len(saved_at),
            "median_steps_between": statistics.median(gaps) if gaps else None}


def _manager(tool: str, folder: str, interval: float):
    """(save(step, state) -> whether a save started, finish()) of ``tool``;
    finish waits for the last save (raising any failure) and closes."""
    if tool == "none":
        return (lambda step, state: False), (lambda: None)
    if tool == "shardkeep":
        import shardkeep as sk
        mgr = sk.CheckpointManager(
            folder, keep_last=2, save_decision_policy=sk.save_decisions.
            ContinuousCheckpointingPolicy(minimum_interval_secs=interval))
        return mgr.save, mgr.close
    import orbax.checkpoint as ocp
    from orbax.checkpoint._src.checkpoint_managers import save_decision_policy as policies
    manager = ocp.CheckpointManager(folder, options=ocp.CheckpointManagerOptions(
        max_to_keep=2, enable_async_checkpointing=True,
        save_decision_policy=policies.ContinuousCheckpointingPolicy(
            minimum_interval_secs=interval)))

    def finish():
        manager.wait_until_finished()
        manager.close()
    return (lambda step, state: manager.save(step, args=ocp.args.StandardSave(state))), finish


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", default="small", choices=["small", "full"])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=2.0,
                        help="minimum_interval_secs of both tools' policies")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out", default=None, help="JSON file for the runs")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--report", default=None, help="print the table of a saved --out file")
    args = parser.parse_args()
    if args.report:
        with open(args.report) as f:
            print(report(json.load(f)["runs"]))
        return
    if args.worker:
        folder = tempfile.mkdtemp(prefix="continuous-", dir=os.environ.get("BENCH_DIR"))
        try:
            print(json.dumps(_loop(args.worker, args.scale, args.seconds, args.interval,
                                   folder)))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "")
                          + " --xla_force_host_platform_device_count=8").strip())
    runs = []
    for rep in range(args.reps):
        order = TOOLS if rep % 2 == 0 else TOOLS[::-1]
        for tool in order:
            out = subprocess.run(
                [sys.executable, __file__, "--worker", tool, "--scale", args.scale,
                 "--seconds", str(args.seconds), "--interval", str(args.interval)],
                env=env, check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), flush=True)
    print(report(runs))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"scale": args.scale, "seconds": args.seconds,
                       "interval": args.interval, "runs": runs}, f, indent=1)


def report(runs: list[dict]) -> str:
    def med(tool, key):
        values = [r[key] for r in runs if r["tool"] == tool and r[key] is not None]
        return statistics.median(values) if values else None
    reference = med("none", "steps_per_s")
    lines = ["| tool | steps/s | throughput lost | committed | median steps between"
             " | training time lost per save |", "|---|---|---|---|---|---|"]
    for tool in TOOLS:
        rate, committed = med(tool, "steps_per_s"), med(tool, "committed")
        lost = 1 - rate / reference
        seconds = statistics.median(r["seconds"] for r in runs if r["tool"] == tool)
        # The time the loop would have needed for the steps it did not make.
        per_save = f"{lost * seconds / committed * 1000:.0f} ms" if committed else "—"
        lines.append(f"| {tool} | {rate:.2f} | {lost:.1%} | {committed} |"
                     f" {med(tool, 'median_steps_between')} | {per_save} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
