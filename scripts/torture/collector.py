"""The crash torture's racing collector: what another job does to a shared root.

Run by driver.py with the path of a control folder. Until killed, it
collects leftovers under the root named in <control>/root, in a loop, the
two ways other jobs do: it opens a CheckpointManager there (whose primary
collects at once) and lists its steps, and it runs `shardkeep gc ROOT`.
Saves in flight hold leases, so none of this may cost the writer a
checkpoint. While <control>/pause exists it stops and touches
<control>/paused, so that the checker sees a root no collector is changing.
Each round appends one line to <control>/rounds.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import shardkeep as sk  # noqa: E402

import workload  # noqa: E402

logging.getLogger("shardkeep").setLevel(logging.ERROR)
CLI = os.path.join(os.path.dirname(sys.executable), "shardkeep")


def collect_once(root: str, use_gc: bool) -> str:
    if use_gc:
        done = subprocess.run([CLI, "gc", root], capture_output=True, text=True, timeout=120)
        removed = sum(line.startswith("removed ") and "leftovers" not in line
                      for line in done.stdout.splitlines())
        return f"gc rc={done.returncode} removed={removed}"
    with sk.CheckpointManager(root, step_width=workload.STEP_WIDTH,
                              options=workload.OPTIONS) as mgr:
        return f"manager steps={len(mgr.all_steps())}"


def main(control: str) -> int:
    pause, paused = os.path.join(control, "pause"), os.path.join(control, "paused")
    use_gc = False
    with open(os.path.join(control, "rounds"), "a") as rounds:
        while True:
            if os.path.exists(pause):
                open(paused, "w").close()
                time.sleep(0.005)
                continue
            if os.path.exists(paused):
                os.remove(paused)
            with open(os.path.join(control, "root")) as f:
                root = f.read().strip()
            if not os.path.isdir(root):
                time.sleep(0.01)
                continue
            try:
                outcome = collect_once(root, use_gc)
            except sk.ShardkeepError as e:  # racing a writer's deletion, say
                outcome = f"error {type(e).__name__}: {e}"
            rounds.write(outcome.replace("\n", " ") + "\n")
            rounds.flush()
            use_gc = not use_gc
            time.sleep(0.05)  # dozens of rounds per trial; the writer needs the cores


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
