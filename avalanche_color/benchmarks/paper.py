"""The paper's benchmarks: Split CIFAR-100, CORe50 (NI) and DomainNet, with the paper's (S-Prompts') transforms.

Split CIFAR-100 and CORe50 come from Avalanche's generators, which read ``root`` and download
into it what is missing (where a network is reachable). DomainNet has no Avalanche
generator: it is read from its published layout under ``root``,

    <root>/<domain>/<class>/<file>.jpg
    <root>/<domain>_train.txt, <root>/<domain>_test.txt   (lines "<domain>/<class>/<file>.jpg <label>")

with the images loaded lazily, per sample (about 600,000 images: far too many to decode up front).

With ``task_labels=True`` experience i carries task label i (for oracle routing), otherwise
every experience carries task label 0.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from avalanche.benchmarks import paths_benchmark
from avalanche.benchmarks.classic import CORe50, SplitCIFAR100

from avalanche_color.benchmarks.stream_building import (DEFAULT_MEAN, DEFAULT_STD, check_domains, check_seed,
                                                        generic_benchmark, task_labels_of)
from avalanche_color.benchmarks.transforms import paper_transforms

CIFAR100_EXPERIENCES = 10
CIFAR100_LAYOUT = ("<root>/cifar-100-python/{train,test,meta}, the python version of CIFAR-100 "
                   "(https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz, unpacked)")
CORE50_LAYOUT = ("<root>/core50_128x128/, <root>/batches_filelists/ and <root>/{paths,labels,LUP,labels2names}.pkl "
                 "(https://vlomonaco.github.io/core50/)")
DOMAINNET_DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
DOMAINNET_CLASSES = 345
DOMAINNET_LAYOUT = ("<root>/<domain>/<class>/<file>.jpg with the split files <root>/<domain>_train.txt and "
                    "<root>/<domain>_test.txt, lines '<domain>/<class>/<file>.jpg <label>' "
                    "(http://ai.bu.edu/M3SDA/)")


def split_cifar100(root: str | Path, *, image_size: int = 224, mean: Sequence[float] = DEFAULT_MEAN,
                   std: Sequence[float] = DEFAULT_STD, seed: int = 0, task_labels: bool = False,
                   shuffle_classes: bool = False):
    """Split CIFAR-100: 10 experiences of 10 classes, contiguous in CIFAR-100's order as in the paper
    (classes 0-9, then 10-19, ...), or in an order shuffled by ``seed`` (``shuffle_classes=True``).

    Class ids stay CIFAR-100's own (0-99). ``root`` holds (or receives) ``cifar-100-python/``.
    Note that Avalanche calls ``torch.manual_seed(seed)``, which resets torch's global random state.
    """
    check_seed(seed)
    if not isinstance(shuffle_classes, bool):
        raise TypeError(f"shuffle_classes must be a bool, got {shuffle_classes!r}")
    train_transform, eval_transform = paper_transforms(image_size, mean, std)
    order = None if shuffle_classes else list(range(100))
    with _download_or_explain("CIFAR-100", root, CIFAR100_LAYOUT):
        return SplitCIFAR100(CIFAR100_EXPERIENCES, seed=seed, fixed_class_order=order, return_task_id=task_labels,
                             dataset_root=root, train_transform=train_transform, eval_transform=eval_transform)


def core50_ni(root: str | Path, *, image_size: int = 224, mean: Sequence[float] = DEFAULT_MEAN,
              std: Sequence[float] = DEFAULT_STD, task_labels: bool = False):
    """CORe50's NI scenario (run 0): 8 training experiences of new sessions of the 50 objects.

    The test stream is one experience, the three held-out sessions, so no experience's task
    label fits it: ``task_labels=True`` (oracle routing) is refused.
    """
    if task_labels:
        raise ValueError("task_labels=True is not supported for core50: its NI test set is one experience of "
                         "held-out sessions, which belongs to no training experience (no oracle routing)")
    train_transform, eval_transform = paper_transforms(image_size, mean, std)
    with _download_or_explain("CORe50", root, CORE50_LAYOUT):
        return CORe50(scenario="ni", dataset_root=root, train_transform=train_transform,
                      eval_transform=eval_transform)


def domainnet(root: str | Path, *, image_size: int = 224, mean: Sequence[float] = DEFAULT_MEAN,
              std: Sequence[float] = DEFAULT_STD, task_labels: bool = False,
              domains: Sequence[str] = DOMAINNET_DOMAINS):
    """DomainNet, domain-incremental: experience i is ``domains[i]`` with its published train/test split.

    Labels are the split files' (0-344). Images are read from disk when a sample is drawn.
    """
    domains = check_domains(domains, DOMAINNET_DOMAINS)
    train_transform, eval_transform = paper_transforms(image_size, mean, std)
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"DomainNet folder {str(root)!r} does not exist: expected {DOMAINNET_LAYOUT}")
    train, test = [], []
    for domain in domains:
        if not (root / domain).is_dir():
            raise FileNotFoundError(f"DomainNet image folder {str(root / domain)!r} does not exist: "
                                    f"expected {DOMAINNET_LAYOUT}")
        train.append(read_split_file(root, root / f"{domain}_train.txt"))
        test.append(read_split_file(root, root / f"{domain}_test.txt"))
    return generic_benchmark(paths_benchmark, train, test, task_labels=task_labels_of(len(domains), task_labels),
                             train_transform=train_transform, eval_transform=eval_transform)


def read_split_file(root: Path, split_file: Path) -> list[tuple[str, int]]:
    """The (image path, label) pairs a DomainNet split file lists, the paths joined to ``root``."""
    if not split_file.is_file():
        raise FileNotFoundError(f"DomainNet split file {str(split_file)!r} does not exist: expected {DOMAINNET_LAYOUT}")
    pairs = []
    for number, line in enumerate(split_file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2 or not fields[1].isdigit() or int(fields[1]) >= DOMAINNET_CLASSES:
            raise ValueError(f"{str(split_file)}:{number}: expected '<domain>/<class>/<file>.jpg <label>' with a "
                             f"label in 0..{DOMAINNET_CLASSES - 1}, got {line!r}")
        pairs.append((str(root / fields[0]), int(fields[1])))
    if not pairs:
        raise ValueError(f"DomainNet split file {str(split_file)!r} lists no images")
    return pairs


@contextmanager
def _download_or_explain(name: str, root: str | Path, layout: str) -> Iterator[None]:
    """Turns a failed download (or a damaged copy) inside Avalanche into an error saying what to provide."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        raise FileNotFoundError(f"{name} is not complete in {str(root)!r} and could not be downloaded there "
                                f"({type(error).__name__}: {error}); expected {layout}") from error
