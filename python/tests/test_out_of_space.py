"""A save that fills the disk says so plainly and leaves nothing behind.

On a real, small file system (a 2 MiB tmpfs): mounting one needs root,
which CI has; elsewhere the test is skipped.
"""

import os
import re
import subprocess

import numpy as np
import pytest

import shardkeep as sk


@pytest.fixture
def small_disk(tmp_path):
    """A freshly mounted 2 MiB tmpfs, unmounted after the test."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / "small_disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
        capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: " + mounted.stderr.strip())
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_full_disk_is_out_of_space_with_sizes_and_leaves_nothing(small_disk):
    too_big = {"w": np.arange(1 << 20, dtype=np.float32)}  # 4 MiB
    with pytest.raises(sk.OutOfSpaceError) as info:
        sk.save(str(small_disk / "1"), too_big, options=sk.Options(io_threads=1))
    message = str(info.value)
    needed = re.search(r"ran out of space: process 0 had (\d+) bytes to write", message)
    free = re.search(r"\((\d+) bytes free on its file system\)", message)
    assert needed and free, message
    assert int(needed.group(1)) >= too_big["w"].nbytes
    assert int(free.group(1)) < 2 << 20
    assert isinstance(info.value, sk.StorageError)  # still a storage failure
    # The failed save removed its temporary folder: the space is free again.
    assert os.listdir(small_disk) == []

    small = {"w": np.arange(1024, dtype=np.float32)}
    sk.save(str(small_disk / "2"), small)
    np.testing.assert_array_equal(sk.load(str(small_disk / "2"))["w"], small["w"])
