"""Streams of the user's own data: an image-folder tree, or a function that returns an Avalanche benchmark.

**Image folders** follow torchvision's ``ImageFolder`` convention: one folder per class, named after it, its
images anywhere below it (``.jpg``, ``.png``, ... as torchvision reads them). A class-incremental tree
(:func:`image_folder_class`, the runner's ``image_folder_class``)::

    DIR/train/<class>/<image>
    DIR/test/<class>/<image>

Its classes, in the order of their names, are split into ``experiences`` experiences of consecutive classes
(the first ones one class more where they do not divide evenly; default: two classes each). A
domain-incremental tree (:func:`image_folder_domain`, the runner's ``image_folder_domain``)::

    DIR/<domain>/train/<class>/<image>
    DIR/<domain>/test/<class>/<image>

is one experience per domain, in the order of their names, every domain labelled in one class space: the
class names of all domains, in the order of their names. Class ``i`` is the ``i``-th name in both. Images are
read from disk when a sample is drawn, converted to RGB, and resized to the backbone's input with its
interpolation and normalisation (:mod:`~avalanche_color.benchmarks.transforms`).

**A function** named ``package.module:function`` (the form entry points use; ``module:Class.method`` too) is
imported (the folder the command runs from first on the import path, then the installed packages) and called
with the keywords it declares among ``image_size``, ``mean``, ``std``, ``interpolation`` (the backbone's
preprocessing), ``seed``, ``task_labels`` (experience i gets task label i; the oracle methods need it) and
``data`` (``--data``, as given). It returns an Avalanche benchmark: a ``train_stream`` and a ``test_stream``
whose experiences' datasets have ``targets`` (what ``avalanche.benchmarks``' generators return).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from avalanche.benchmarks import paths_benchmark

from avalanche_color.benchmarks.requests import CALLABLE_FORM, SettingError, StreamRequest, is_callable_name
from avalanche_color.benchmarks.stream_building import (DEFAULT_MEAN, DEFAULT_STD, check_seed, generic_benchmark,
                                                        subsample_per_class, task_labels_of)
from avalanche_color.benchmarks.transforms import Augmentation, offline_transforms

# torchvision.datasets.folder.IMG_EXTENSIONS: the files ImageFolder reads as images.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
CLASS_LAYOUT = "DIR/train/<class>/<image> and DIR/test/<class>/<image>"
DOMAIN_LAYOUT = "DIR/<domain>/train/<class>/<image> and DIR/<domain>/test/<class>/<image>"
# What the runner passes a user's function, where it declares the keyword.
KEYWORDS = ("image_size", "mean", "std", "interpolation", "seed", "task_labels", "data")

Files = list[tuple[str, int]]  # (image path, class index)


# ---------------------------------------------------------------------- image folders


def image_folder_class(root: str | Path, *, experiences: Optional[int] = None, image_size: int = 224,
                       mean: Sequence[float] = DEFAULT_MEAN, std: Sequence[float] = DEFAULT_STD,
                       interpolation: str = "bilinear", augmentation: Augmentation = "paper", seed: int = 0,
                       task_labels: bool = False, train_per_class: Optional[int] = None):
    """A class-incremental stream from ``root/train/<class>/...`` and ``root/test/<class>/...``.

    Args:
        root: the tree's folder.
        experiences: how many experiences the classes (in the order of their names) are split into, each of
            consecutive classes; None: two classes each.
        image_size, mean, std, interpolation: the backbone's input side and preprocessing.
        augmentation: the training augmentation: ``"paper"`` (random resized crop and flip; evaluation
            resizes and centre-crops) or ``"light"`` (resize, pad-and-crop, flip), see
            :mod:`~avalanche_color.benchmarks.transforms`.
        seed: the seed of ``train_per_class``'s subsample.
        task_labels: experience i carries task label i (else 0 throughout).
        train_per_class: keep at most this many training images of each class (seeded); None: all.
    """
    root = _folder(root, CLASS_LAYOUT)
    train, classes = _split_folder(root / "train", CLASS_LAYOUT)
    test, test_classes = _split_folder(root / "test", CLASS_LAYOUT)
    unknown = sorted(set(test_classes) - set(classes))
    if unknown:
        raise ValueError(f"image folder {str(root / 'test')!r} has classes with no training folder: {unknown[:5]} "
                         f"(expected {CLASS_LAYOUT}, the same classes in both)")
    test = [(file, classes.index(test_classes[label])) for file, label in test]
    groups = class_groups(len(classes), experiences)
    train = _subsampled(train, train_per_class, seed)
    in_group = lambda files, group: [(file, label) for file, label in files if label in group]  # noqa: E731
    return _benchmark([in_group(train, group) for group in groups], [in_group(test, group) for group in groups],
                      task_labels, image_size, mean, std, interpolation, augmentation)


def image_folder_domain(root: str | Path, *, image_size: int = 224, mean: Sequence[float] = DEFAULT_MEAN,
                        std: Sequence[float] = DEFAULT_STD, interpolation: str = "bilinear",
                        augmentation: Augmentation = "paper", seed: int = 0, task_labels: bool = False,
                        train_per_class: Optional[int] = None):
    """A domain-incremental stream from ``root/<domain>/train/<class>/...`` and ``root/<domain>/test/<class>/...``:
    one experience per domain, in the order of their names, labelled in one class space (every domain's class
    names, in the order of their names). The arguments are :func:`image_folder_class`'s; ``train_per_class``
    keeps at most that many training images of each class in each domain."""
    root = _folder(root, DOMAIN_LAYOUT)
    domains = _subfolders(root)
    if not domains:
        raise ValueError(f"image folder {str(root)!r} has no domain folders: expected {DOMAIN_LAYOUT}")
    read = {}
    for domain in domains:
        if not (domain / "train").is_dir() or not (domain / "test").is_dir():
            raise ValueError(f"domain folder {str(domain)!r} needs a train/ and a test/ folder: expected "
                             f"{DOMAIN_LAYOUT}")
        read[domain] = (_split_folder(domain / "train", DOMAIN_LAYOUT), _split_folder(domain / "test", DOMAIN_LAYOUT))
    names = sorted({name for splits in read.values() for _, classes in splits for name in classes})
    train, test = [], []
    for (domain_train, train_classes), (domain_test, test_classes) in read.values():
        train.append(_subsampled([(file, names.index(train_classes[label])) for file, label in domain_train],
                                 train_per_class, seed))
        test.append([(file, names.index(test_classes[label])) for file, label in domain_test])
    return _benchmark(train, test, task_labels, image_size, mean, std, interpolation, augmentation)


def class_groups(count: int, experiences: Optional[int]) -> list[list[int]]:
    """``count`` class indices split into ``experiences`` runs of consecutive classes, the first ones a class
    longer where they do not divide evenly (None: two classes each)."""
    if experiences is None:
        experiences = max(1, count // 2)
    if isinstance(experiences, bool) or not isinstance(experiences, int) or not 1 <= experiences <= count:
        raise SettingError("experiences", f"experiences must be an integer from 1 to the {count} classes of the "
                                          f"image folder, got {experiences!r}")
    return [group.tolist() for group in np.array_split(np.arange(count), experiences)]


def _folder(root: str | Path, layout: str) -> Path:
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist: expected {layout}")
    return root


def _subfolders(folder: Path) -> list[Path]:
    """The folders in ``folder`` in the order of their names, hidden ones (``.name``) left out."""
    return sorted((entry for entry in folder.iterdir() if entry.is_dir() and not entry.name.startswith(".")),
                  key=lambda entry: entry.name)


def _split_folder(folder: Path, layout: str) -> tuple[Files, list[str]]:
    """The images of ``folder/<class>/...`` as (path, index into the class names), and the class names sorted."""
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder {str(folder)!r} does not exist: expected {layout}")
    classes = _subfolders(folder)
    if not classes:
        raise ValueError(f"image folder {str(folder)!r} has no class folders: expected {layout}")
    files: Files = []
    for label, folder_of_class in enumerate(classes):
        images = sorted(str(path) for path in folder_of_class.rglob("*")
                        if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file())
        if not images:
            raise ValueError(f"class folder {str(folder_of_class)!r} holds no images ({', '.join(IMAGE_SUFFIXES)})")
        files += [(image, label) for image in images]
    return files, [entry.name for entry in classes]


def _subsampled(files: Files, per_class: Optional[int], seed: int) -> Files:
    if per_class is None:
        return files
    check_seed(seed)
    keep = subsample_per_class(torch.as_tensor([label for _, label in files]), per_class, np.random.default_rng(seed))
    return [files[index] for index in keep.tolist()]


def _benchmark(train: list[Files], test: list[Files], task_labels: bool, image_size: int, mean: Sequence[float],
               std: Sequence[float], interpolation: str, augmentation: str):
    train_transform, eval_transform = offline_transforms(augmentation, image_size, mean, std, interpolation)
    return generic_benchmark(paths_benchmark, train, test, task_labels=task_labels_of(len(train), task_labels),
                             train_transform=train_transform, eval_transform=eval_transform)


# ---------------------------------------------------------------------- a function returning a benchmark


def load_function(name: str) -> Callable[..., Any]:
    """The callable ``package.module:function`` names (:class:`SettingError` for ``benchmark`` where it cannot be
    imported or is not callable)."""
    if not is_callable_name(name):
        raise SettingError("benchmark", f"benchmark must be {CALLABLE_FORM}, got {name!r}")
    module_name, attributes = name.split(":")
    if os.getcwd() not in sys.path:  # a module beside the user's script, as `python script.py` finds it
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and module_name.startswith(error.name):  # the module itself, not its imports
            raise SettingError("benchmark", f"module {module_name!r} cannot be found: give a module in the folder "
                                            "the command runs from, on PYTHONPATH or installed") from None
        raise
    for attribute in attributes.split("."):
        if not hasattr(target, attribute):
            raise SettingError("benchmark", f"{module_name} has no {attributes!r}: name a function of it "
                                            f"({CALLABLE_FORM})")
        target = getattr(target, attribute)
    if not callable(target):
        raise SettingError("benchmark", f"{name} is a {type(target).__name__}, not a function returning a benchmark")
    return target


def declared_keywords(function: Callable[..., Any]) -> set[str]:
    """Which of :data:`KEYWORDS` ``function`` takes (all of them with ``**kwargs``)."""
    parameters = inspect.signature(function).parameters.values()
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return set(KEYWORDS)
    return {parameter.name for parameter in parameters if parameter.name in KEYWORDS
            and parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}


def function_benchmark(name: str, request: StreamRequest) -> Any:
    """The benchmark the function ``name`` (``package.module:function``) returns for ``request``: called with the
    request's values of the keywords it declares (:data:`KEYWORDS`). Refuses (:class:`SettingError`) ``--data``
    or task labels it takes no keyword for, and a result that is not an Avalanche benchmark."""
    function = load_function(name)
    declared = declared_keywords(function)
    if request.data is not None and "data" not in declared:
        raise SettingError("data", f"benchmark {name} takes no data keyword: leave the data path out, or give the "
                                   "function a data parameter")
    if request.task_labels and "task_labels" not in declared:
        raise SettingError("methods", f"the methods that route by task label need {name} to take a task_labels "
                                      "keyword (experience i gets task label i when it is True)")
    values = dict(image_size=request.image_size, mean=tuple(request.mean), std=tuple(request.std),
                  interpolation=request.interpolation, seed=request.seed, task_labels=request.task_labels,
                  data=request.data)
    benchmark = function(**{keyword: value for keyword, value in values.items()
                            if keyword in declared and (keyword != "data" or value is not None)})
    check_benchmark(benchmark, name)
    return benchmark


def check_benchmark(benchmark: Any, name: str) -> None:
    """Refuses (:class:`SettingError` for ``benchmark``) anything but an Avalanche benchmark whose streams are not
    empty and whose experiences' datasets have integer ``targets``."""
    what = f"benchmark {name} returned"
    if not (hasattr(benchmark, "train_stream") and hasattr(benchmark, "test_stream")):
        raise SettingError("benchmark", f"{what} a {type(benchmark).__name__}, not an Avalanche benchmark (an "
                                        "object with a train_stream and a test_stream, as avalanche.benchmarks' "
                                        "generators return)")
    for stream in ("train_stream", "test_stream"):
        experiences = list(getattr(benchmark, stream))
        if not experiences:
            raise SettingError("benchmark", f"{what} an empty {stream}")
        for index, experience in enumerate(experiences):
            dataset = getattr(experience, "dataset", None)
            targets = getattr(dataset, "targets", None)
            if targets is None or len(dataset) == 0:
                raise SettingError("benchmark", f"{what} {stream} experience {index} with no samples or no targets "
                                                "(its dataset's class labels)")
