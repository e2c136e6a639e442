"""Writing files so that a crash leaves the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from pathlib import Path
from typing import Union

import torch

PathLike = Union[str, "os.PathLike[str]"]


def write_atomically(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file, fsync and rename: all of it or none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # as open() would create it, not mkstemp's 0600
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    # The rename is durable only once the folder's entry is on disk (POSIX; Windows cannot open folders).
    if os.name != "posix":
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def torch_save_atomically(obj: object, path: PathLike) -> None:
    """``torch.save(obj, path)``, written atomically (see :func:`write_atomically`)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    write_atomically(path, buffer.getvalue())
