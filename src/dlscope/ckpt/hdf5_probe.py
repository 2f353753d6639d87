"""`python -m dlscope.ckpt.hdf5_probe FILE`: touch every HDF5 object and attribute of FILE (or of
the .h5 members of a .keras zip), in a process of its own.

A malformed file can make the HDF5 library loop forever, or crash, inside C code, where no Python
timeout or signal handler runs. `ckpt inspect` therefore runs this probe first, in a child with a
timeout (`probe_hdf5`), and reads the file itself only when the probe came back. Imports h5py
only: the probe starts in a fraction of a second.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

from dlscope.errors import CheckpointError

PROBE_TIMEOUT_S = 30.0  # the probe reads no data: seconds on a busy machine; a loop never ends
MAX_OBJECTS = 200_000  # beyond this the reader refuses the file anyway


def probe_hdf5(path: Path) -> None:
    """Raise a one-line CheckpointError when the HDF5 library loops (killed after PROBE_TIMEOUT_S)
    or crashes on the file; the reader's own errors are left to the reader to describe."""
    timeout = PROBE_TIMEOUT_S
    if importlib.util.find_spec("h5py") is None:
        return  # the reader says h5py is missing
    command = [sys.executable, "-m", "dlscope.ckpt.hdf5_probe", str(path)]
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:  # subprocess.run has killed the child
        raise CheckpointError(
            f"the HDF5 library was still reading the file's structure after {timeout:g} s "
            "(a malformed file can make it loop forever); gave up",
            path,
        ) from None
    if done.returncode < 0:
        raise CheckpointError(f"the HDF5 library crashed reading this file (signal {-done.returncode})", path)


def touch_all(h5) -> None:  # h5: an h5py.File or Group
    import h5py

    count = 0

    def visit(name: str, obj) -> bool | None:
        nonlocal count
        count += 1
        for key in obj.attrs:
            obj.attrs[key]
        if isinstance(obj, h5py.Dataset):
            obj.dtype, obj.shape, obj.id.get_offset(), obj.id.get_storage_size()
        return True if count >= MAX_OBJECTS else None  # a true value stops the walk

    for key in h5.attrs:
        h5.attrs[key]
    h5.visititems(visit)


def probe(path: str) -> None:
    import h5py

    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            for name in zf.namelist():
                if name.endswith(".h5"):
                    with zf.open(name) as member, h5py.File(member, "r") as h5:
                        touch_all(h5)
        return
    with h5py.File(path, "r") as h5:
        touch_all(h5)


if __name__ == "__main__":
    try:
        probe(sys.argv[1])
    except Exception:  # the reader describes faults it can name; the probe only bounds time
        sys.exit(1)
