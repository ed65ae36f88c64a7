"""Writes the format-compatibility checkpoints into cpp/testdata/compat/v<N>.

    .venv/bin/python scripts/make_compat_checkpoints.py

Each is saved by a real JAX job from
python/tests/multiprocess/compat_checkpoint.py: "raw" (without compression)
and "zstd" (with it) by 4 processes of 2 CPU devices each, "small" (a few
leaves, compressed; also the fuzz seed that runs fastest) by one process. Run it once per format version, when the version is bumped
(docs/FORMAT.md §6), into a new folder; never regenerate an old version's
folder, since the point is that old checkpoints keep loading.
"""

import pathlib
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "tests" / "multiprocess"))
import harness  # noqa: E402

FORMAT_VERSION = 3


def main() -> None:
    out = ROOT / "cpp" / "testdata" / "compat" / f"v{FORMAT_VERSION}"
    jobs = (("raw", 4, 2, {"compress": False}), ("zstd", 4, 2, {"compress": True}),
            ("small", 1, 1, {"compress": True, "small": True}))
    for name, processes, devices, args in jobs:
        path = out / name
        shutil.rmtree(path, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        harness.run_job(processes, devices, "compat_checkpoint:save",
                        {"path": str(path), **args})
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        print(f"{path.relative_to(ROOT)}: {size} bytes")


if __name__ == "__main__":
    main()
