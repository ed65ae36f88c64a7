"""What a benchmark run measured: package versions and shardkeep's commit."""

from __future__ import annotations

import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def versions(names: list[str]) -> dict:
    """The installed version of each distribution (None when absent), and
    ``shardkeep_commit``: the checkout's short commit, marked when its
    python/ or cpp/ has uncommitted changes."""
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", HERE, "status", "--porcelain", "--", "python", "cpp"],
                           capture_output=True, text=True).stdout.strip()
    out["shardkeep_commit"] = commit + ("+uncommitted changes" if dirty else "")
    return out


def machine_info() -> dict:
    """Kernel, Python, cores, CPU model and memory of this machine."""
    import platform
    info = {"kernel": platform.release(), "python": platform.python_version(),
            "cores": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f
                               if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    with open("/proc/meminfo") as f:
        info["memory_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    return info
