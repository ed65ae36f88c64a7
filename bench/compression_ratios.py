"""What compression does to each kind of training-state data: Orbax's
default (TensorStore zarr3 + OCDBT, zstd level 3 on each chunk's bytes as
they are) beside shardkeep's ``compression="zstd"`` (byte planes, then zstd
at each level given), as stored size ÷ raw size. Each array is saved alone
by both, in one process; times are the minimum of REPS saves.

    python bench/compression_ratios.py --out-dir bench/results-compression [--levels -30,1,3]

Writes compression.json and COMPRESSION.md in --out-dir.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import time

import ml_dtypes
import numpy as np

import shardkeep as sk

REPS = 3
ELEMENTS = 4 << 20


def _arrays() -> dict[str, np.ndarray]:
    """Values as a trainer's state holds them (scales of a small transformer)."""
    rng = np.random.default_rng(0)
    normal = rng.standard_normal(ELEMENTS, dtype=np.float32)
    grads = rng.standard_normal(ELEMENTS, dtype=np.float32) * 1e-3
    return {
        "bf16 params N(0, 0.02)": (normal * 0.02).astype(ml_dtypes.bfloat16),
        "f32 params N(0, 0.02)": normal * 0.02,
        "f32 params, bf16-valued": (normal * 0.02).astype(ml_dtypes.bfloat16).astype(np.float32),
        "f32 Adam mu (0.1 g)": grads * 0.1,
        "f32 Adam nu (0.001 g^2)": grads * grads * 1e-3,
        "f32 norm scales (ones)": np.ones(ELEMENTS, np.float32),
        "int32 token ids < 32000": rng.integers(0, 32000, ELEMENTS, dtype=np.int32),
    }


def _stored_bytes(path: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _timed_save(save, path: pathlib.Path) -> float:
    best = float("inf")
    for _ in range(REPS):
        shutil.rmtree(path, ignore_errors=True)
        start = time.perf_counter()
        save(path)
        best = min(best, time.perf_counter() - start)
    return best


def _orbax_save(array: np.ndarray):
    import orbax.checkpoint as ocp  # imported here: only this column needs it

    def save(path: pathlib.Path) -> None:
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(path, {"a": array})
            checkpointer.wait_until_finished()
    return save


def _shardkeep_save(array: np.ndarray, level: int | None):
    options = sk.Options() if level is None else sk.Options(compression="zstd",
                                                           compression_level=level)
    return lambda path: sk.save(str(path), {"a": array}, options=options)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", default="bench/results-compression")
    parser.add_argument("--levels", default="-100,-30,1,3")
    parser.add_argument("--root", default="/tmp/shardkeep-bench-compression")
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    root = pathlib.Path(args.root)
    rows = []
    for name, array in _arrays().items():
        tools = {"orbax default": _orbax_save(array), "shardkeep raw": _shardkeep_save(array, None)}
        tools.update({f"shardkeep zstd {level}": _shardkeep_save(array, level) for level in levels})
        row = {"data": name, "raw_bytes": array.nbytes}
        for tool, save in tools.items():
            path = root / "ckpt"
            seconds = _timed_save(save, path)
            row[tool] = {"ratio": _stored_bytes(path) / array.nbytes, "seconds": seconds}
        rows.append(row)
        print(name, {t: f"{v['ratio']:.3f} {v['seconds'] * 1e3:.0f} ms" for t, v in row.items()
                     if isinstance(v, dict)}, flush=True)
    shutil.rmtree(root, ignore_errors=True)
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compression.json").write_text(json.dumps(rows, indent=2) + "\n")
    tools = [key for key in rows[0] if isinstance(rows[0][key], dict)]
    lines = [f"# Stored size ÷ raw size ({ELEMENTS / 2**20:.0f} Mi elements each; "
             f"save time, best of {REPS})", "",
             "Made by `python bench/compression_ratios.py`; each array saved alone, in one process.", "",
             "| data | " + " | ".join(tools) + " |", "|---|" + "---|" * len(tools)]
    for row in rows:
        lines.append(f"| {row['data']} | " + " | ".join(
            f"{row[t]['ratio']:.3f} ({row[t]['seconds'] * 1e3:.0f} ms)" for t in tools) + " |")
    (out / "COMPRESSION.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
