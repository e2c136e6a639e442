"""Tiny fake copies of the paper's data sets in their real on-disk formats (never the real archives).

Each writer makes what :mod:`avalanche_color.benchmarks.paper` reads: CIFAR-100's pickled python
batches, CORe50's image folders with its pickled indexes and NI file lists, and DomainNet's
domain folders with their split files. Images are seeded noise.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

DOMAINNET_CLASS_NAMES = ("aircraft_carrier", "airplane", "alarm_clock", "ambulance")


def jpeg(rng: np.random.Generator, height: int = 64, width: int = 64) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def write_cifar100(root: Path, train_per_class: int = 2, test_per_class: int = 1) -> dict[str, str]:
    """``<root>/cifar-100-python/{train,test,meta}`` as torchvision reads them; returns their md5 sums.

    torchvision checks the files' md5 sums before reading them: patch :func:`use_md5_sums` with
    the returned sums, so no download is attempted and the real reading code runs.
    """
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    sums = {}
    for name, per_class in (("train", train_per_class), ("test", test_per_class)):
        labels = [label for label in range(100) for _ in range(per_class)]
        data = rng.integers(0, 256, (len(labels), 3 * 32 * 32), dtype=np.uint8)
        sums[name] = _pickle(folder / name, {"data": data, "fine_labels": labels, "coarse_labels": [0] * len(labels)})
    sums["meta"] = _pickle(folder / "meta", {"fine_label_names": [f"class{i}" for i in range(100)]})
    return sums


def use_md5_sums(monkeypatch, sums: dict[str, str]) -> None:
    """Make torchvision's CIFAR-100 accept the fake files :func:`write_cifar100` wrote."""
    from torchvision.datasets import CIFAR100

    monkeypatch.setattr(CIFAR100, "train_list", [["train", sums["train"]]])
    monkeypatch.setattr(CIFAR100, "test_list", [["test", sums["test"]]])
    monkeypatch.setattr(CIFAR100, "meta", {**CIFAR100.meta, "md5": sums["meta"]})


def write_core50(root: Path, objects: int = 2, size: int = 32) -> None:
    """CORe50's files for the NI scenario, run 0: 8 training sessions and a test set, one image per
    object each, object o labelled o."""
    rng = np.random.default_rng(0)
    lists = root / "batches_filelists" / "NI_inc" / "run0"
    lists.mkdir(parents=True)
    (root / "NIC_v2_79_cat").mkdir()  # present: Avalanche then skips rewriting category file lists
    paths: list[str] = []
    labels, lup = [], []
    for batch in range(9):  # 8 training sessions, then the test set
        batch_paths = [f"s{batch + 1}/o{obj + 1}/C_{batch + 1:02d}_{obj + 1:02d}_000.png" for obj in range(objects)]
        for path in batch_paths:
            (root / "core50_128x128" / path).parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(root / "core50_128x128" / path)
        lup.append(list(range(len(paths), len(paths) + objects)))
        paths += batch_paths
        labels.append(list(range(objects)))
        name = "test_filelist.txt" if batch == 8 else f"train_batch_{batch:02d}_filelist.txt"
        (lists / name).write_text("".join(f"{p} {label}\n" for label, p in enumerate(batch_paths)))
    for name, content in (("paths", paths), ("labels", {"ni": [labels]}), ("LUP", {"ni": [lup]}),
                          ("labels2names", {"ni": [{o: f"o{o + 1}" for o in range(objects)}]})):
        (root / f"{name}.pkl").write_bytes(pickle.dumps(content))


def write_domainnet(root: Path, domains: Sequence[str], classes: int = 3, train_per_class: int = 2,
                    height: int = 20, width: int = 12) -> None:
    """DomainNet's published layout for ``domains``: ``classes`` classes, non-square images,
    ``train_per_class`` training images and one test image per class and domain."""
    rng = np.random.default_rng(0)
    for domain in domains:
        lines: dict[str, list[str]] = {"train": [], "test": []}
        for label, name in enumerate(DOMAINNET_CLASS_NAMES[:classes]):
            (root / domain / name).mkdir(parents=True)
            for i, split in enumerate(["train"] * train_per_class + ["test"]):
                relative = f"{domain}/{name}/{domain}_{label:03d}_{i:06d}.jpg"
                (root / relative).write_bytes(jpeg(rng, height, width))
                lines[split].append(f"{relative} {label}")
        for split, listed in lines.items():
            (root / f"{domain}_{split}.txt").write_text("\n".join(listed) + "\n")


def _pickle(path: Path, content: dict) -> str:
    path.write_bytes(pickle.dumps(content))
    return hashlib.md5(path.read_bytes()).hexdigest()
