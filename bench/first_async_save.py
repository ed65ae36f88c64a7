"""The blocking part of the first ``save_async`` in a fresh process, then
of a second one, in wall time and in the process's CPU time.

The suite's W1 ``async_save`` is this first save, one per repetition; its
spread from one fresh process to the next is wider than most changes being
judged. To compare two builds, run many processes of each alternately:
the baseline build (``bench/.work/baseline-<commit>``, see baseline.py)
comes first on PYTHONPATH, e.g.

    for i in $(seq 14); do
      PYTHONPATH=bench/.work/baseline-54b5536 python bench/first_async_save.py --root DIR
      python bench/first_async_save.py --root DIR
    done

Prints one JSON line per process, naming the shardkeep it imported.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import fresh_process


def main(argv=None) -> int:
    parser = fresh_process.parser(__doc__)
    parser.add_argument("--saves", type=int, default=2)
    args = parser.parse_args(argv)
    import shardkeep as sk

    state, root = fresh_process.w1_state_and_folder(args.scale, args.root, "first-async-save")
    result: dict = {"shardkeep": os.path.dirname(sk.__file__), "scale": args.scale, "saves": []}
    for i in range(args.saves):
        wall, cpu = time.perf_counter(), time.process_time()
        future = sk.save_async(os.path.join(root, str(i)), state)
        blocking, blocking_cpu = time.perf_counter() - wall, time.process_time() - cpu
        future.result()
        result["saves"].append({"blocking_s": blocking, "blocking_cpu_s": blocking_cpu,
                                "total_s": time.perf_counter() - wall})
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
