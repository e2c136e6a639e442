"""Writing files and folders so that a failure leaves the old one or the new one, never half of one."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import Callable, Union

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


def write_folder_atomically(folder: PathLike, write: Callable[[Path], None], *, replaceable: Collection[str]) -> Path:
    """Fill a new folder beside ``folder`` with ``write(new_folder)``, then rename it to ``folder``.

    The folder and the files ``write`` puts in it get the permissions ``mkdir`` and ``open`` would
    give them (the umask's). A failure anywhere leaves ``folder`` as it was (absent, or the
    previous complete one). An existing ``folder`` is replaced only if it holds nothing but files
    named in ``replaceable`` (an earlier save); a folder holding anything else is refused with a
    ``ValueError``.
    """
    folder = Path(folder)
    if folder.exists():
        others = sorted(p.name for p in folder.iterdir() if p.name not in replaceable) if folder.is_dir() else None
        if others is None or others:
            what = "is not a folder" if others is None else f"holds other files ({', '.join(others)})"
            raise ValueError(f"folder {str(folder)!r} {what}; save into a new or empty folder, or over an earlier save")
    folder.parent.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    previous = None
    try:
        write(new)
        umask = os.umask(0)
        os.umask(umask)
        for path in new.iterdir():
            # As open() would create them: some writers (safetensors' save_file) leave 0600 whatever the umask.
            os.chmod(path, 0o666 & ~umask)
            with open(path, "rb") as file:
                os.fsync(file.fileno())
        os.chmod(new, 0o777 & ~umask)  # as mkdir would create it, not mkdtemp's 0700
        _fsync_folder(new)
        if folder.exists():
            previous = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".old"))
            os.replace(folder, previous)  # onto the empty placeholder
        try:
            os.replace(new, folder)
        except BaseException:
            if previous is not None:
                os.replace(previous, folder)
                previous = None
            raise
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    finally:
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
    _fsync_folder(folder.parent)
    return folder


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
