"""An earlier build of shardkeep, measured beside this one (suite.py
--baseline COMMIT) as the tool ``shardkeep-baseline``.

A regression check needs both builds in one run: these machines differ
from one run to the next by more than the change being judged. The commit
is built once into ``bench/.work/baseline-<commit>`` (``pip install
--target``; later runs reuse it), and the baseline's measurements find it
first on PYTHONPATH. Everything else (the workloads, the peers, jax) is
shared, so the two columns differ in shardkeep alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TOOL = "shardkeep-baseline"


def short_commit(commit: str) -> str:
    """The abbreviated hash of ``commit``; ValueError when git does not know it."""
    proc = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "--verify",
                           f"{commit}^{{commit}}"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ValueError(f"--baseline {commit}: not a commit of this repository "
                         f"({proc.stderr.strip()})")
    return proc.stdout.strip()


def build(commit: str) -> str:
    """The folder holding ``commit``'s shardkeep package, built if missing."""
    folder = os.path.join(HERE, ".work", f"baseline-{commit}")
    if os.path.isdir(os.path.join(folder, "shardkeep")):
        return folder
    shutil.rmtree(folder + ".partial", ignore_errors=True)
    print(f"building the baseline {commit} into {os.path.relpath(folder, REPO)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="shardkeep-baseline-") as source:
        # The committed files only, as a fresh clone would have them.
        archive = subprocess.run(["git", "-C", REPO, "archive", commit],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", source], input=archive, check=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
                        "--no-deps", "--target", folder + ".partial",
                        "-C", f"build-dir={os.path.join(HERE, '.build', 'baseline-' + commit)}",
                        source], check=True)
    # Renamed when whole: a build cut short is not taken for a finished one.
    os.rename(folder + ".partial", folder)
    return folder


def environment(folder: str, env: dict | None) -> dict:
    """``env`` (or this process's) with the baseline first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, env.get("PYTHONPATH")) if p)
    return env
