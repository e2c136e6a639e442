"""The benchmarks the comparison runner knows, by name, with what each needs.

Every builder takes the same keywords, so the runner treats all streams alike:
``data`` (a path, or None for the default), the backbone's ``image_size``, ``mean`` and
``std``, a ``seed``, ``task_labels`` (experience i gets task label i: for oracle routing)
and ``train_per_class`` (a seeded subsample, to make CPU runs cheaper; where supported).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Optional

Scenario = Literal["domain-incremental", "class-incremental"]
# What a benchmark does with --data: nothing (the bundled digits), an optional zip file or folder
# (else AVALANCHE_COLOR_DATA or a download), or a required folder (its data set is or will be there).
DataUse = Literal["none", "optional", "required"]


@dataclass(frozen=True)
class BenchmarkSpec:
    name: str
    scenario: Scenario
    num_classes: int
    k: int  # the paper's rule: 5 domain-incremental, 2 x the new classes class-incremental
    backbone: str  # the default backbone spec for load_backbone (or "digits")
    build: Callable[..., Any]
    offline: bool  # runs here without a download or a user-given data folder
    # Test experience i holds the test data of training experience i. False for CORe50 (NI), whose
    # one test experience holds held-out sessions that belong to no training experience: no task
    # label to route by (no oracle), no expert that is the right one for a test sample.
    paired_test_stream: bool = True
    data: DataUse = "optional"


def _pacs(data, image_size, mean, std, seed, task_labels, train_per_class):
    from avalanche_color.benchmarks.offline import pacs
    _refuse_subsample("pacs", train_per_class)
    return pacs(*_path(data), image_size=image_size, mean=mean, std=std, seed=seed, task_labels=task_labels)


def _split_tiny_imagenet(data, image_size, mean, std, seed, task_labels, train_per_class):
    from avalanche_color.benchmarks.offline import split_tiny_imagenet
    return split_tiny_imagenet(*_path(data), image_size=image_size, mean=mean, std=std, seed=seed,
                               task_labels=task_labels, train_per_class=train_per_class)


def _split_cifar100(data, image_size, mean, std, seed, task_labels, train_per_class):
    from avalanche_color.benchmarks.paper import split_cifar100
    _refuse_subsample("split_cifar100", train_per_class)
    return split_cifar100(_required(data, "split_cifar100"), image_size=image_size, mean=mean, std=std,
                          seed=seed, task_labels=task_labels)


def _core50(data, image_size, mean, std, seed, task_labels, train_per_class):
    from avalanche_color.benchmarks.paper import core50_ni
    _refuse_subsample("core50", train_per_class)
    return core50_ni(_required(data, "core50"), image_size=image_size, mean=mean, std=std, task_labels=task_labels)


def _domainnet(data, image_size, mean, std, seed, task_labels, train_per_class):
    from avalanche_color.benchmarks.paper import domainnet
    _refuse_subsample("domainnet", train_per_class)
    return domainnet(_required(data, "domainnet"), image_size=image_size, mean=mean, std=std,
                     task_labels=task_labels)


def _digits(kind: Scenario):
    def build(data, image_size, mean, std, seed, task_labels, train_per_class):
        from avalanche_color.benchmarks.digits import class_incremental_stream, digits_split, domain_incremental_stream
        _refuse_subsample(f"digits ({kind})", train_per_class)
        stream = class_incremental_stream if kind == "class-incremental" else domain_incremental_stream
        return stream(digits_split(seed), task_labels=task_labels)
    return build


BENCHMARKS: dict[str, BenchmarkSpec] = {spec.name: spec for spec in (
    BenchmarkSpec("pacs", "domain-incremental", 7, 5, "offline", _pacs, True),
    BenchmarkSpec("split_tiny_imagenet", "class-incremental", 100, 20, "offline", _split_tiny_imagenet, True),
    BenchmarkSpec("split_cifar100", "class-incremental", 100, 20, "vit_base_patch16_224.augreg_in21k",
                  _split_cifar100, False, data="required"),
    BenchmarkSpec("core50", "domain-incremental", 50, 5, "vit_base_patch16_224.augreg_in21k", _core50, False,
                  paired_test_stream=False, data="required"),
    BenchmarkSpec("domainnet", "domain-incremental", 345, 5, "vit_base_patch16_224.augreg_in21k", _domainnet, False,
                  data="required"),
    BenchmarkSpec("digits_class", "class-incremental", 10, 4, "digits", _digits("class-incremental"), True,
                  data="none"),
    BenchmarkSpec("digits_domain", "domain-incremental", 10, 5, "digits", _digits("domain-incremental"), True,
                  data="none"),
)}


def benchmark_spec(name: str) -> BenchmarkSpec:
    if name not in BENCHMARKS:
        raise ValueError(f"benchmark must be one of {sorted(BENCHMARKS)}, got {name!r}")
    return BENCHMARKS[name]


def check_data(name: str, data: Optional[Path]) -> None:
    """Refuses ``data`` that ``name`` cannot use, before anything is built or written: a path
    given to a benchmark that takes none, a missing one where it is required, a path that does
    not exist, an empty folder, or a file that is not a zip archive."""
    import zipfile  # here: the registry is read by the command line, which answers --help at once

    spec = benchmark_spec(name)
    if spec.data == "none":
        if data is not None:
            raise ValueError(f"benchmark {name!r} takes no data (its images ship with scikit-learn), got {str(data)!r}"
                             ": leave the data path out")
        return
    if data is None:
        if spec.data == "required":
            _required(data, name)
        return
    path = Path(data)
    if spec.data == "required":  # Avalanche downloads into a folder that may not exist yet
        if path.is_file():
            raise ValueError(f"benchmark {name!r} takes a folder, got the file {str(path)!r}")
        return
    if not path.exists():
        raise ValueError(f"data path {str(path)!r} does not exist: give the data set's zip file or unpacked folder")
    if path.is_dir() and not any(path.iterdir()):
        raise ValueError(f"data folder {str(path)!r} is empty: give the data set's zip file or unpacked folder")
    if path.is_file() and not zipfile.is_zipfile(path):
        raise ValueError(f"data path {str(path)!r} is not a readable zip file: give the data set's zip file or its "
                         "unpacked folder")


def _path(data: Optional[Path]) -> tuple[Path, ...]:
    return () if data is None else (Path(data),)


def _required(data: Optional[Path], name: str) -> Path:
    if data is None:
        raise ValueError(f"benchmark {name!r} needs --data: the folder its data set is (or will be downloaded) in")
    return Path(data)


def _refuse_subsample(name: str, train_per_class: Optional[int]) -> None:
    if train_per_class is not None:
        raise ValueError(f"train_per_class is only supported for split_tiny_imagenet, not {name}")
