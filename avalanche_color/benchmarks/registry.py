"""The benchmarks the comparison runner knows, by name, with what each needs.

A benchmark's builder takes one :class:`StreamRequest` (the data path, the backbone's image size,
mean and std, the seed, whether experience i gets task label i, and a per-class subsample of the
training data), so the runner treats all streams alike; :meth:`BenchmarkSpec.stream` refuses what
a benchmark does not support before building anything. A new benchmark is one builder and one entry
of :data:`BENCHMARKS` (and, for the paper's settings, a preset in ``runner/presets.py``).

The user's own data runs too (:mod:`~avalanche_color.benchmarks.user_data`): ``image_folder_class`` and
``image_folder_domain`` read an image-folder tree, and a name ``package.module:function`` (the form entry
points use) calls that function for the benchmark it returns. Their classes, k and pairing are the data's:
:func:`measured_spec` reads them from the built stream.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence

from avalanche_color.benchmarks.requests import CALLABLE_FORM, SettingError, StreamRequest, is_callable_name

Scenario = Literal["domain-incremental", "class-incremental"]
# What a benchmark does with --data: nothing (the bundled digits), an optional zip file or folder
# (else AVALANCHE_COLOR_DATA or a download), a required folder (its data set is or will be there), a folder that
# must exist (the user's image folders), or any existing path, given to a user's function as it is.
DataUse = Literal["none", "optional", "required", "existing_folder", "passed"]
@dataclass(frozen=True)
class BenchmarkSpec:
    name: str
    scenario: Scenario
    num_classes: int
    k: int  # the paper's rule: 5 domain-incremental, 2 x the new classes class-incremental
    backbone: str  # the default backbone spec for load_backbone (or "digits")
    build: Callable[[StreamRequest], Any]
    offline: bool  # runs here without a download or a user-given data folder
    # Test experience i holds the test data of training experience i. False for CORe50 (NI), whose
    # one test experience holds held-out sessions that belong to no training experience: no task
    # label to route by (no oracle), no expert that is the right one for a test sample.
    paired_test_stream: bool = True
    data: DataUse = "optional"
    subsample: bool = False  # takes train_per_class
    # The augmentations it takes (the first is its own): the offline streams either, the paper's streams
    # S-Prompts' alone, the digits none (their images are only resized to the backbone's input), a user's
    # function none (it makes its own transforms).
    augmentations: tuple[str, ...] = ()
    splits_classes: bool = False  # takes experiences (the number its classes are split into)
    # Its classes, k, scenario and pairing are the data's, the values above placeholders (the user's data):
    # measured_spec reads them from the stream.
    measured: bool = False
    # Settings every request of this spec gets (StreamRequest fields the runner's request does not fill).
    settings: tuple[tuple[str, Any], ...] = ()

    def stream(self, request: StreamRequest) -> Any:
        """The benchmark's stream for ``request`` (an Avalanche benchmark with train and test streams)."""
        request = dataclasses.replace(request, **dict(self.settings))
        for setting in ("train_per_class", "experiences"):
            problem = self.setting_problem(setting, getattr(request, setting))
            if problem:
                raise SettingError(setting, f"{setting} {problem}, got {getattr(request, setting)!r}")
        problem = self.augmentation_problem(request.augmentation)
        if problem:
            raise ValueError(f"augmentation {problem}, got {request.augmentation!r}")
        if self.data == "required":
            _required(request.data, self.name)
        return self.build(request)

    def configured(self, **settings: Any) -> "BenchmarkSpec":
        """This spec with ``settings`` (fields of :class:`StreamRequest`, e.g. ``experiences``) given to every
        request it builds a stream for."""
        unknown = sorted(set(settings) - {field.name for field in dataclasses.fields(StreamRequest)})
        if unknown:
            raise TypeError(f"settings must be StreamRequest fields, got {unknown}")
        return dataclasses.replace(self, settings=tuple(sorted({**dict(self.settings), **settings}.items())))

    def setting_problem(self, setting: str, value: object) -> Optional[str]:
        """What is wrong with giving ``setting`` (``"train_per_class"`` or ``"experiences"``) to this benchmark
        (None: it takes it, or the value is None)."""
        takes = {"train_per_class": "subsample", "experiences": "splits_classes"}[setting]
        if value is None or getattr(self, takes):
            return None
        return f"is not supported for {self.name}: only {', '.join(takers(takes))} take it"

    def augmentation_problem(self, augmentation: Optional[str]) -> Optional[str]:
        """What is wrong with ``augmentation`` for this benchmark (None: it takes it, or None for its own)."""
        if augmentation is None or augmentation in self.augmentations:
            return None
        if not self.augmentations:
            return f"is not supported for {self.name}, whose images go to the backbone as they are"
        return f"must be one of {list(self.augmentations)} for {self.name}"


OFFLINE_AUGMENTATIONS = ("light", "paper")  # avalanche_color.benchmarks.transforms.AUGMENTATIONS, without torch
PAPER_AUGMENTATION = ("paper",)


def _pacs(request: StreamRequest):
    from avalanche_color.benchmarks.pacs import pacs
    return pacs(*request.paths, seed=request.seed, task_labels=request.task_labels,
                interpolation=request.interpolation, train_per_class=request.train_per_class,
                augmentation=request.augmentation or "light", **request.images)


def _split_tiny_imagenet(request: StreamRequest):
    from avalanche_color.benchmarks.tiny_imagenet import split_tiny_imagenet
    return split_tiny_imagenet(*request.paths, seed=request.seed, task_labels=request.task_labels,
                               train_per_class=request.train_per_class, interpolation=request.interpolation,
                               augmentation=request.augmentation or "light", **request.images)


def _split_cifar100(request: StreamRequest):
    from avalanche_color.benchmarks.paper import split_cifar100
    return split_cifar100(*request.paths, seed=request.seed, task_labels=request.task_labels, **request.images)


def _core50(request: StreamRequest):
    from avalanche_color.benchmarks.paper import core50_ni
    return core50_ni(*request.paths, task_labels=request.task_labels, **request.images)


def _domainnet(request: StreamRequest):
    from avalanche_color.benchmarks.paper import domainnet
    return domainnet(*request.paths, task_labels=request.task_labels, **request.images)


def _digits(kind: Scenario):
    def build(request: StreamRequest):
        from avalanche_color.benchmarks.digits import class_incremental_stream, digits_split, domain_incremental_stream
        stream = class_incremental_stream if kind == "class-incremental" else domain_incremental_stream
        return stream(digits_split(request.seed), task_labels=request.task_labels,
                      interpolation=request.interpolation, **request.images)
    return build


def _image_folder(kind: Scenario):
    def build(request: StreamRequest):
        from avalanche_color.benchmarks.user_data import image_folder_class, image_folder_domain
        options = dict(seed=request.seed, task_labels=request.task_labels, train_per_class=request.train_per_class,
                       interpolation=request.interpolation, augmentation=request.augmentation or "paper",
                       **request.images)
        if kind == "class-incremental":
            return image_folder_class(_required(request.data, "image_folder_class"), experiences=request.experiences,
                                      **options)
        return image_folder_domain(_required(request.data, "image_folder_domain"), **options)
    return build


def _function(name: str):
    def build(request: StreamRequest):
        from avalanche_color.benchmarks.user_data import function_benchmark
        return function_benchmark(name, request)
    return build


BENCHMARKS: dict[str, BenchmarkSpec] = {spec.name: spec for spec in (
    BenchmarkSpec("pacs", "domain-incremental", 7, 5, "offline", _pacs, True, subsample=True,
                  augmentations=OFFLINE_AUGMENTATIONS),
    BenchmarkSpec("split_tiny_imagenet", "class-incremental", 100, 20, "offline", _split_tiny_imagenet, True,
                  subsample=True, augmentations=OFFLINE_AUGMENTATIONS),
    BenchmarkSpec("split_cifar100", "class-incremental", 100, 20, "vit_base_patch16_224.augreg_in21k",
                  _split_cifar100, False, data="required", augmentations=PAPER_AUGMENTATION),
    BenchmarkSpec("core50", "domain-incremental", 50, 5, "vit_base_patch16_224.augreg_in21k", _core50, False,
                  paired_test_stream=False, data="required", augmentations=PAPER_AUGMENTATION),
    BenchmarkSpec("domainnet", "domain-incremental", 345, 5, "vit_base_patch16_224.augreg_in21k", _domainnet, False,
                  data="required", augmentations=PAPER_AUGMENTATION),
    BenchmarkSpec("digits_class", "class-incremental", 10, 4, "digits", _digits("class-incremental"), True,
                  data="none"),
    BenchmarkSpec("digits_domain", "domain-incremental", 10, 5, "digits", _digits("domain-incremental"), True,
                  data="none"),
    # The user's image folders (benchmarks.user_data): classes, k and pairing measured from the folders.
    BenchmarkSpec("image_folder_class", "class-incremental", 0, 4, "offline", _image_folder("class-incremental"),
                  True, data="existing_folder", subsample=True, augmentations=("paper", "light"), splits_classes=True,
                  measured=True),
    BenchmarkSpec("image_folder_domain", "domain-incremental", 0, 5, "offline", _image_folder("domain-incremental"),
                  True, data="existing_folder", subsample=True, augmentations=("paper", "light"), measured=True),
)}


def takers(attribute: str) -> list[str]:
    """The registered benchmarks whose spec has ``attribute`` true (``"subsample"``: those taking train_per_class)."""
    return [name for name, spec in BENCHMARKS.items() if getattr(spec, attribute)]


def benchmark_problem(name: object) -> Optional[str]:
    """What is wrong with ``name`` as a benchmark (None: a registered name or a ``package.module:function``)."""
    if name in BENCHMARKS or is_callable_name(name):
        return None
    return f"must be one of {sorted(BENCHMARKS)} or {CALLABLE_FORM} (a function returning an Avalanche benchmark)"


def benchmark_spec(name: str) -> BenchmarkSpec:
    """The spec of a registered benchmark, or of a user's ``package.module:function`` (its function is imported
    only when a stream is built)."""
    problem = benchmark_problem(name)
    if problem:
        raise ValueError(f"benchmark {problem}, got {name!r}")
    if name in BENCHMARKS:
        return BENCHMARKS[name]
    return BenchmarkSpec(name, "class-incremental", 0, 4, "offline", _function(name), True, data="passed",
                         measured=True)


def measured_spec(spec: BenchmarkSpec, stream: Any) -> BenchmarkSpec:
    """``spec`` with the classes, k, scenario and pairing of its built ``stream``, where they are the data's
    (``spec.measured``): the number of classes is the largest label + 1; a function's scenario is class-incremental
    where its training experiences' classes are disjoint, else domain-incremental; k is the paper's rule (2 x the
    most classes an experience brings class-incremental, 5 domain-incremental); test experience i is training experience i's where the two streams are as long."""
    if not spec.measured:
        return spec
    classes = [{int(label) for label in experience.dataset.targets} for experience in stream.train_stream]
    tested = set().union(*({int(label) for label in experience.dataset.targets} for experience in stream.test_stream))
    seen = set().union(*classes)
    disjoint = sum(len(experience) for experience in classes) == len(seen)
    scenario: Scenario = spec.scenario  # an image folder's is its layout's; a function's is read from its stream
    if spec.name not in BENCHMARKS:
        scenario = "class-incremental" if disjoint and len(classes) > 1 else "domain-incremental"
    k = 2 * max(len(experience) for experience in classes) if scenario == "class-incremental" else 5
    return dataclasses.replace(spec, scenario=scenario, num_classes=max(seen | tested) + 1, k=k,
                               paired_test_stream=len(stream.test_stream) == len(stream.train_stream))


def check_data(name: str, data: Optional[Path]) -> None:
    """Refuses ``data`` that ``name`` cannot use, before anything is built or written: a path
    given to a benchmark that takes none, a missing one where it is required, a path that does
    not exist, an empty folder, or a file that is not a zip archive."""
    import zipfile  # here: the registry is read by the command line, which answers --help at once

    spec = benchmark_spec(name)
    if spec.data in ("existing_folder", "passed"):
        _existing(data, spec)
        return
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


def _existing(data: Optional[Path], spec: BenchmarkSpec) -> None:
    """Refuses a missing folder for an image-folder benchmark, a path that does not exist for a user's function."""
    if data is None:
        if spec.data == "existing_folder":
            raise ValueError(f"benchmark {spec.name!r} needs --data: the image folder it reads (see the runner's "
                             "docs for its layout)")
        return
    path = Path(data)
    if not path.exists():
        raise ValueError(f"data path {str(path)!r} does not exist")
    if spec.data == "existing_folder" and not path.is_dir():
        raise ValueError(f"benchmark {spec.name!r} takes a folder, got the file {str(path)!r}")


def _required(data: Optional[Path], name: str) -> Path:
    if data is None:
        raise ValueError(f"benchmark {name!r} needs --data: the folder its data set is (or will be downloaded) in")
    return Path(data)
