"""W4: one measurement as a 2-process job on this machine.

Same command line as measure.py. Starts two measure.py workers joined on a
free loopback port: by jax.distributed (4 CPU devices each) for the JAX
tools, by a torch.distributed gloo group for DCP (each rank holding its half
of the state as DTensors). Each worker times the operation between the same
barriers; writes one record: the slowest process's time (when the job is
done) and each process's peak RSS.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROCESSES = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str]) -> int:
    out = argv[argv.index("--out") + 1]
    rest = [a for i, a in enumerate(argv) if a != "--out" and (i == 0 or argv[i - 1] != "--out")]
    coordinator = f"127.0.0.1:{free_port()}"
    outs = [tempfile.mktemp(suffix=f"-p{i}.json") for i in range(PROCESSES)]
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "measure.py")] + rest +
                              ["--out", outs[i], "--num-processes", str(PROCESSES),
                               "--process-id", str(i), "--coordinator", coordinator],
                              env=env, stderr=subprocess.PIPE, text=True)
             for i in range(PROCESSES)]
    stderrs = [p.communicate()[1] for p in procs]
    records = []
    for i, path in enumerate(outs):
        try:
            with open(path) as f:
                records.append(json.load(f))
            os.remove(path)
        except (OSError, ValueError):
            lines = [line for line in stderrs[i].splitlines() if line.strip()]
            records.append({"ok": False, "error": f"process {i}: "
                            + (lines[-1] if lines else f"exit {procs[i].returncode}")})
    merged = dict(records[0])
    merged["processes"] = records
    merged["ok"] = all(r.get("ok") for r in records)
    if merged["ok"]:
        merged["seconds"] = max(r["seconds"] for r in records)
        merged["peak_rss_kib"] = max(r["peak_rss_kib"] for r in records)
    else:
        merged["error"] = "; ".join(r["error"] for r in records if not r.get("ok"))
        merged["not_applicable"] = all(r.get("not_applicable") for r in records)
        sys.stderr.write("\n".join(stderrs))
    with open(out, "w") as f:
        json.dump(merged, f, indent=1)
    return 0 if merged["ok"] or merged.get("not_applicable") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
