"""What the first-save scripts (first_async_save.py, manager_first_save.py)
share: each is one fresh process, given a scale and a root, that saves W1's
state under a folder of its own."""

from __future__ import annotations

import argparse
import os
import shutil

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import workloads  # noqa: E402


def parser(doc: str) -> argparse.ArgumentParser:
    """The script's parser, with --scale and --root."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--scale", default="small", choices=sorted(workloads.LLAMA_SCALES))
    parser.add_argument("--root", required=True)
    return parser


def w1_state_and_folder(scale: str, root: str, name: str):
    """W1's state on the devices, and ``root/name`` emptied for the saves."""
    import jax
    state = jax.block_until_ready(workloads.jax_state("W1", scale))
    folder = os.path.join(os.path.abspath(root), name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    return state, folder
