"""The first async save of a CheckpointManager in a fresh process: how long
it blocks when the manager saw one step that did not save before it (and
so made the staging memory ready in the background), and when it did not.

Each run is one fresh process; run both kinds alternately, e.g.

    for p in 0 1 0 1; do python bench/manager_first_save.py --scale full \
        --root /path/on/disk --prepared $p; done

With --prepared 1 the manager first sees step 1 (not due); the script then
waits until the staging memory is ready, as the training steps in between
would, and saves step 5. Prints one JSON line.
"""

from __future__ import annotations

import json
import shutil
import sys
import time

import fresh_process


def main(argv=None) -> int:
    parser = fresh_process.parser(__doc__)
    parser.add_argument("--prepared", type=int, choices=(0, 1), default=1)
    args = parser.parse_args(argv)
    import shardkeep as sk
    from shardkeep.saving import staging_pool

    state, root = fresh_process.w1_state_and_folder(args.scale, args.root, "manager-first-save")
    result: dict = {"scale": args.scale, "prepared": bool(args.prepared)}
    with sk.CheckpointManager(root, save_interval_steps=5) as manager:
        if args.prepared:
            start = time.perf_counter()
            manager.save(1, state)  # not due: the staging memory is prepared
            result["step_1_seconds"] = time.perf_counter() - start
            while staging_pool.kept_bytes() == 0:
                time.sleep(0.01)
            result["ready_after_seconds"] = time.perf_counter() - start
        start = time.perf_counter()
        manager.save(5, state)
        result["blocking_seconds"] = time.perf_counter() - start
        manager.wait()
        result["total_seconds"] = time.perf_counter() - start
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
