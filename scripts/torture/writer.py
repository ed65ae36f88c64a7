"""The crash torture's writer: a training loop's checkpointing, to be killed.

Run by driver.py with one JSON argument (the plan of the trial). It opens
the manager on the root (collecting what the last killed writer left),
resumes after the latest committed step and saves a step-derived state
each step; every few steps it waits and force-replaces the latest step
with a compressed copy of the same values. Retention deletes a step at
nearly every commit. Each step it knows to be committed is appended to the
report file and fsynced before it moves on, so the checker can hold the
root to it. Storage faults ("SIGKILL before the k-th Rename") come from the
plan and are armed through the binding's test-only fault plan.

Exit status: 0 when the plan ran to its end without being killed.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=2").strip()

import shardkeep as sk  # noqa: E402
from shardkeep import _core  # noqa: E402

import workload  # noqa: E402

faults = _core.testing


class Reporter:
    """Appends each newly committed latest step to the report file, durably."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._last = None

    def __call__(self, mgr: sk.CheckpointManager) -> None:
        latest = mgr.latest_step()
        if latest is not None and (self._last is None or latest > self._last):
            os.write(self._fd, f"{latest}\n".encode())
            os.fsync(self._fd)
            self._last = latest


def out_of_space(error: BaseException) -> bool:
    text = str(error)
    return "No space left" in text or "ENOSPC" in text or "space" in text.lower()


def fill_disk(ballast: str, leave_free: int) -> None:
    """Fills the file system of ``ballast`` up to ``leave_free`` bytes."""
    st = os.statvfs(os.path.dirname(ballast))
    size = max(st.f_bavail * st.f_frsize - leave_free, 0)
    with open(ballast, "wb") as f:
        f.truncate(0)
        chunk = b"\0" * (1 << 20)
        while size > 0:
            try:
                size -= f.write(chunk[:min(size, len(chunk))])
            except OSError:
                break


def main(plan: dict) -> int:
    counting = plan.get("calibrate", False)
    if plan.get("rules") or counting:
        faults.arm_storage_faults([tuple(r) for r in plan.get("rules", [])])
    disk_full = plan.get("disk_full")
    scale = plan.get("scale", 1)
    report = Reporter(plan["report"])
    mgr = workload.manager(plan["root"], disk_full=bool(disk_full))
    print("ready", flush=True)
    calibration = {}
    if counting:
        calibration["start"] = faults.storage_call_counts()
        faults.arm_storage_faults([])
    start = (mgr.latest_step() or 0) + 1
    replaces = 0
    for i, step in enumerate(range(start, start + plan["steps"])):
        if disk_full and i == disk_full["fill_at"]:
            fill_disk(disk_full["ballast"], disk_full["leave_free"])
        try:
            mgr.save(step, workload.checkpointables(step, scale=scale))
        except sk.LeaseLostError as e:
            # A collector took the save's folder in the moment before its
            # lease was written (docs/FORMAT.md §7): refused, not lost.
            print(f"step {step}: lease lost: {e}", flush=True)
        except sk.ShardkeepError as e:
            if not (disk_full and out_of_space(e)):
                raise
            print(f"step {step}: out of space: {e}", flush=True)
        report(mgr)
        every = plan.get("replace_every", 0)
        if every and i % every == every - 1:
            mgr.wait()
            report(mgr)
            latest = mgr.latest_step()
            if counting:
                calibration["steps"] = faults.storage_call_counts()
                faults.arm_storage_faults([])
            elif replaces == plan.get("replace_target", -1):
                faults.arm_storage_faults([tuple(r) for r in plan["replace_rules"]])
            sk.save_checkpointables(mgr.step_path(latest), workload.checkpointables(latest),
                                    force=True, step=latest, options=workload.REPLACE_OPTIONS)
            if counting:
                calibration["replace"] = faults.storage_call_counts()
                faults.arm_storage_faults([])
            elif replaces == plan.get("replace_target", -1):
                faults.disarm_storage_faults()
            replaces += 1
    try:
        mgr.close()
    except sk.ShardkeepError as e:
        if not (disk_full and out_of_space(e)):
            raise
    report(mgr)
    if counting:
        print("calibration " + json.dumps(calibration), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
