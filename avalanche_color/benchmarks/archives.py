"""Reading image data sets from a zip archive or an unpacked folder, decoded once and cached.

The offline data sets (PACS and Tiny-ImageNet, resized small) come as zip files; users may
also have them unpacked. Their location is a ``--data`` path, or the folder named by the
``AVALANCHE_COLOR_DATA`` environment variable (see :func:`data_path`). Either way the images are decoded into one uint8 tensor per split and cached
as a ``.pt`` file in the cache folder (``AVALANCHE_COLOR_CACHE``, else ``~/.cache/avalanche_color``),
so later runs start in seconds.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch
from PIL import Image
from torch import Tensor

from avalanche_color.utils.files import torch_save_atomically, write_atomically

DATA_ENV = "AVALANCHE_COLOR_DATA"  # a folder holding the data sets' zip files or folders
CACHE_ENV = "AVALANCHE_COLOR_CACHE"  # where decoded images and downloads are kept
CACHE_DIR = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "avalanche_color")


def cache_folder(cache_dir: Optional[Path]) -> Path:
    """``cache_dir``, or :data:`CACHE_DIR` where it is None (read at call time, so tests can move it)."""
    return CACHE_DIR if cache_dir is None else Path(cache_dir)


def data_path(path: Optional[str | Path], file_name: str, data_set: str, source: str,
              url: Optional[str] = None) -> Path:
    """``path`` if given, else ``file_name`` in the ``AVALANCHE_COLOR_DATA`` folder, else the
    public download at ``url`` (kept under ``downloads/`` in :data:`CACHE_DIR`) if there is one.

    Raises a ``FileNotFoundError`` saying how to give the data and where to get it.
    """
    if path is not None:
        return Path(path)
    folder = os.environ.get(DATA_ENV)
    if folder:
        return Path(folder) / file_name
    how = (f"pass --data PATH (its zip file or unpacked folder) or set {DATA_ENV} to the folder holding "
           f"{file_name}. {source}")
    if url is None:
        raise FileNotFoundError(f"{data_set} is not given: {how}")
    target = CACHE_DIR / "downloads" / url.rsplit("/", 1)[-1]
    if not target.is_file():
        try:
            download(url, target)
        except OSError as error:  # no network, a proxy, a full disk
            raise FileNotFoundError(f"{data_set} is not given and downloading {url} failed ({error}): {how}") from error
    return target


def download(url: str, target: Path) -> None:
    """Fetch ``url`` into ``target``, written atomically (a failed download leaves nothing)."""
    from urllib.request import urlopen

    print(f"downloading {url} to {target}", flush=True)
    with urlopen(url, timeout=60) as response:
        write_atomically(target, response.read())


class Archive:
    """The files of a zip archive or of a folder, addressed by their relative POSIX path."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"data path {str(self.path)!r} does not exist: give the data set's zip file or folder")
        try:
            self._zip = zipfile.ZipFile(self.path) if self.path.is_file() else None
        except zipfile.BadZipFile as error:  # truncated or not a zip: say which file
            raise ValueError(f"data path {str(self.path)!r} is not a readable zip file ({error}): give the data "
                             "set's zip file or its unpacked folder") from None

    def names(self) -> list[str]:
        if self._zip is not None:
            return [n for n in self._zip.namelist() if not n.endswith("/")]
        return sorted(p.relative_to(self.path).as_posix() for p in self.path.rglob("*") if p.is_file())

    def read(self, name: str) -> bytes:
        if self._zip is not None:
            return self._zip.read(name)
        return (self.path / name).read_bytes()

    def find(self, suffix: str) -> str:
        """The one member whose path ends with ``suffix`` (archives may add a top folder)."""
        matches = [n for n in self.names() if n == suffix or n.endswith("/" + suffix)]
        if len(matches) != 1:
            raise FileNotFoundError(f"expected one file ending in {suffix!r} in {str(self.path)!r}, found {len(matches)}")
        return matches[0]

    def fingerprint(self) -> str:
        """Identifies the archive's contents cheaply (names, sizes), for cache keys."""
        digest = hashlib.blake2b(digest_size=8)
        if self._zip is not None:
            for info in self._zip.infolist():
                digest.update(f"{info.filename}:{info.file_size}:{info.CRC}\n".encode())
        else:
            for name in self.names():
                digest.update(f"{name}:{(self.path / name).stat().st_size}\n".encode())
        return digest.hexdigest()


RESAMPLING = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "box": Image.BOX,
              "hamming": Image.HAMMING, "lanczos": Image.LANCZOS}  # timm's interpolation names


def decode_images(archive: Archive, names: Iterable[str], size: int, interpolation: str = "bilinear") -> Tensor:
    """The images as one (N, 3, S, S) uint8 tensor, RGB, resized where needed with ``interpolation``.

    S is ``size``, or the first image's side where that is smaller: images are never enlarged here
    (the streams' transforms enlarge them at run time), so a cache for a large input stays small.
    """
    names = list(names)
    if interpolation not in RESAMPLING:
        raise ValueError(f"interpolation must be one of {tuple(RESAMPLING)}, got {interpolation!r}")
    if names:
        with Image.open(io.BytesIO(archive.read(names[0]))) as first:
            size = min(size, max(first.size))
    images = torch.empty(len(names), 3, size, size, dtype=torch.uint8)
    for i, name in enumerate(names):
        with Image.open(io.BytesIO(archive.read(name))) as image:
            image = image.convert("RGB")
            if image.size != (size, size):
                image = image.resize((size, size), RESAMPLING[interpolation])
            images[i] = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).view(size, size, 3).permute(2, 0, 1)
    return images


def resampled(interpolation: str) -> str:
    """A cache file name's mark of a resampling other than bilinear (the default, unmarked)."""
    return "" if interpolation == "bilinear" else f"_{interpolation}"


def cached(path: Path, build: Callable[[], dict]) -> dict:
    """``build()``'s result, stored at ``path`` the first time and read back afterwards."""
    if path.exists():
        return torch.load(path, map_location="cpu")
    result = build()
    torch_save_atomically(result, path)  # never leave a half-written cache behind
    return result
