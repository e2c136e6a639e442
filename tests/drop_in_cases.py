"""Self-contained tiny data, streams and strategies for test_drop_in.py (issue 14).

Only the public APIs of avalanche_color and Avalanche 0.6 are used here, so the
package's internal modules can move without breaking these tests.

The data: 4 classes, each a fixed random 16 px template plus small noise; the
streams are built with Avalanche's own generators, as a user's script would.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Callable, Optional

import torch
from avalanche.benchmarks import (
    benchmark_from_datasets,
    benchmark_with_validation_stream,
    class_incremental_benchmark,
    data_incremental_benchmark,
    dataset_benchmark,
    filelist_benchmark,
    nc_benchmark,
    new_instances_benchmark,
    ni_benchmark,
    paths_benchmark,
    task_incremental_benchmark,
    tensors_benchmark,
    with_classes_timeline,
)
from avalanche.benchmarks.scenarios.online import OnlineCLScenario, split_online_stream
from avalanche.benchmarks.utils import as_classification_dataset
from avalanche.evaluation.metrics import accuracy_metrics
from avalanche.training import Naive
from avalanche.training.plugins import EvaluationPlugin
from timm.models.vision_transformer import VisionTransformer
from torch.utils.data import Dataset

from avalanche_color import L2P, CoLoR, SPrompts

IMAGE_SIZE = 16
NUM_CLASSES = 4
TRAIN_PER_CLASS = 20
TEST_PER_CLASS = 10
CHANCE = 1 / NUM_CLASSES
LEARNED = 0.6  # "clearly above chance" for the final stream accuracy (chance 0.25)

STRATEGIES = ("CoLoR", "SPrompts", "L2P")
ROUTED = ("CoLoR", "SPrompts")  # the strategies with routing (and router="oracle")


# ------------------------------------------------------------------------------------- model


def tiny_vit(seed: int = 0, **overrides) -> VisionTransformer:
    """A seeded 2-block, 32-wide timm ViT on 16 px images.

    Average pooling: a random tiny ViT's [CLS] output hardly depends on the image,
    so L2P (frozen query and head on the pooled feature) could not learn in a few
    seconds from it; with the patch mean all three strategies learn these streams.
    """
    torch.manual_seed(seed)
    options = dict(img_size=IMAGE_SIZE, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=0,
                   global_pool="avg")
    options.update(overrides)
    return VisionTransformer(**options)


SETTINGS = {
    "CoLoR": dict(rank=4, k=2, lr=0.05, train_epochs=3),
    "SPrompts": dict(prompt_length=2, k=2, lr=0.05, train_epochs=3),
    # The prompt-position outputs of a random tiny ViT carry little of the image: read the pooled feature.
    "L2P": dict(pool_size=4, prompt_length=2, top_n=2, lr=0.03, head_input="pooled", train_epochs=5),
}
CLASSES = {"CoLoR": CoLoR, "SPrompts": SPrompts, "L2P": L2P}
BATCHES = dict(train_mb_size=16, eval_mb_size=64)


def quiet_evaluator(*metrics) -> EvaluationPlugin:
    return EvaluationPlugin(accuracy_metrics(stream=True, experience=True), *metrics, loggers=[])


def build(name: str, *, model: Optional[torch.nn.Module] = None, evaluator=None, **options):
    """One of the three strategies with the tiny settings (``options`` override them)."""
    settings = {**SETTINGS[name], **BATCHES, **options}
    return CLASSES[name](tiny_vit() if model is None else model,
                         evaluator=quiet_evaluator() if evaluator is None else evaluator, **settings)


def build_naive(*, evaluator=None, plugins=None, epochs: int = 3, **options) -> Naive:
    """Avalanche's Naive on the same backbone (with a 4-class head): is the situation valid Avalanche?"""
    model = tiny_vit(num_classes=NUM_CLASSES)
    return Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                 train_epochs=epochs, plugins=plugins,
                 evaluator=quiet_evaluator() if evaluator is None else evaluator, **BATCHES, **options)


# -------------------------------------------------------------------------------------- data


class TinyImages(Dataset):
    """(image, label) pairs with a ``targets`` list, as a torchvision data set has."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels
        self.targets = labels.tolist()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.images[index], int(self.labels[index])


def templates(seed: int = 0) -> torch.Tensor:
    return 2.0 * torch.randn(NUM_CLASSES, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(seed))


def images(classes, split: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy copies of the class templates: ``TRAIN_PER_CLASS`` or ``TEST_PER_CLASS`` per class."""
    per_class = TRAIN_PER_CLASS if split == "train" else TEST_PER_CLASS
    labels = torch.tensor(list(classes)).repeat_interleave(per_class)
    noise_seed = seed + 1 + 1000 * sum(classes) + (0 if split == "train" else 7)
    noise = 0.5 * torch.randn(len(labels), 3, IMAGE_SIZE, IMAGE_SIZE,
                              generator=torch.Generator().manual_seed(noise_seed))
    return templates(seed)[labels] + noise, labels


def dataset(classes, split: str) -> TinyImages:
    return TinyImages(*images(classes, split))


ALL = tuple(range(NUM_CLASSES))
SPLITS = ((0, 1), (2, 3))  # the class-incremental split: 2 experiences x 2 classes


def avalanche_datasets(split: str):
    return [as_classification_dataset(dataset(classes, split)) for classes in SPLITS]


# ----------------------------------------------------------------------------------- streams
# Each builder takes a scratch folder (used only by the file-based ones) and returns a benchmark.


def nc(tmp_path: Path, task_labels: bool = False):
    return nc_benchmark(dataset(ALL, "train"), dataset(ALL, "test"), n_experiences=2, task_labels=task_labels,
                        fixed_class_order=list(ALL))


def ni(tmp_path: Path):
    """Domain-incremental: every experience has all classes."""
    return ni_benchmark(dataset(ALL, "train"), dataset(ALL, "test"), n_experiences=2, seed=0,
                        balance_experiences=True)


def multi_dataset(tmp_path: Path):
    return dataset_benchmark([dataset(c, "train") for c in SPLITS], [dataset(c, "test") for c in SPLITS])


def tensors(tmp_path: Path, task_labels=(0, 0)):
    return tensors_benchmark([images(c, "train") for c in SPLITS], [images(c, "test") for c in SPLITS],
                             task_labels=list(task_labels))


def from_datasets(tmp_path: Path):
    return benchmark_from_datasets(train=avalanche_datasets("train"), test=avalanche_datasets("test"))


def classes_timeline(tmp_path: Path):
    return with_classes_timeline(from_datasets(tmp_path))


def class_incremental(tmp_path: Path):
    return class_incremental_benchmark(
        {"train": as_classification_dataset(dataset(ALL, "train")),
         "test": as_classification_dataset(dataset(ALL, "test"))},
        class_order=list(ALL), num_experiences=2)


def new_instances(tmp_path: Path):
    """Domain-incremental (new style): the training data split in two; one test experience with everything."""
    return new_instances_benchmark(as_classification_dataset(dataset(ALL, "train")),
                                   as_classification_dataset(dataset(ALL, "test")), num_experiences=2, seed=0,
                                   balance_experiences=True)


def task_incremental(tmp_path: Path):
    return task_incremental_benchmark(class_incremental(tmp_path))


def with_validation(tmp_path: Path):
    return benchmark_with_validation_stream(from_datasets(tmp_path), validation_size=0.25, shuffle=True, seed=0)


def data_incremental(tmp_path: Path):
    """All classes in one nc experience, its training data cut in two experiences of mixed classes."""
    torch.manual_seed(0)  # data_incremental_benchmark shuffles with torch's global generator
    whole = nc_benchmark(dataset(ALL, "train"), dataset(ALL, "test"), n_experiences=1, task_labels=False,
                         fixed_class_order=list(ALL))
    return data_incremental_benchmark(whole, experience_size=NUM_CLASSES * TRAIN_PER_CLASS // 2, shuffle=True)


def png_transform():
    from torchvision import transforms

    # PNG bytes 0..255 back to about the templates' scale (-3..3).
    return transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5,) * 3, (1 / 6,) * 3)])


def write_pngs(folder: Path) -> dict[str, list[list[tuple[str, int]]]]:
    """Every image as a 16 px PNG under ``folder``; per split, per experience, (path, label) pairs."""
    from PIL import Image

    files: dict[str, list[list[tuple[str, int]]]] = {}
    for split in ("train", "test"):
        files[split] = []
        for experience, classes in enumerate(SPLITS):
            pixels, labels = images(classes, split)
            codes = ((pixels.clamp(-3, 3) + 3) / 6 * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
            listed = []
            for i, (code, label) in enumerate(zip(codes, labels.tolist())):
                path = folder / split / f"{experience}_{i}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(code).save(path)
                listed.append((str(path), label))
            files[split].append(listed)
    return files


def paths(tmp_path: Path):
    files = write_pngs(tmp_path)
    return paths_benchmark(files["train"], files["test"], task_labels=[0, 0], train_transform=png_transform(),
                           eval_transform=png_transform())


def filelists(tmp_path: Path):
    files = write_pngs(tmp_path)
    lists = {}
    for split, experiences in files.items():
        lists[split] = []
        for experience, listed in enumerate(experiences):
            path = tmp_path / f"{split}_{experience}.txt"
            path.write_text("".join(f"{Path(file).relative_to(tmp_path)} {label}\n" for file, label in listed))
            lists[split].append(path)
    return filelist_benchmark(tmp_path, lists["train"], lists["test"], task_labels=[0, 0],
                              train_transform=png_transform(), eval_transform=png_transform())


def online(tmp_path: Path, access_task_boundaries: bool = True, scenario: bool = False):
    """``nc`` cut into chunks of 10 samples by Avalanche's online scenario (4 chunks per experience).

    Returns (the chunks to train on, the test stream): from ``split_online_stream``, or with
    ``scenario`` from the (deprecated, still used) ``OnlineCLScenario``.
    """
    whole = nc(tmp_path)
    if scenario:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Deprecated. Use `split_online_stream` ..."
            online_benchmark = OnlineCLScenario(whole.streams.values(), experience_size=CHUNK,
                                                access_task_boundaries=access_task_boundaries)
        return online_benchmark.train_online_stream, online_benchmark.original_test_stream
    chunks = split_online_stream(whole.train_stream, experience_size=CHUNK,
                                 access_task_boundaries=access_task_boundaries)
    return chunks, whole.test_stream


CHUNK = 10  # samples per chunk of the online streams


class TaskLabelledImages(TinyImages):
    """Like ``TinyImages``, with task labels 1-4 mixed within the data set (``targets_task_labels``)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        super().__init__(images, labels)
        self.targets_task_labels = [1 + i % 4 for i in range(len(labels))]

    def __getitem__(self, index: int):
        return (*super().__getitem__(index), self.targets_task_labels[index])


def mixed_task_labels(tmp_path: Path):
    """Class-incremental, each experience holding samples of task labels 1, 2, 3 and 4."""
    return dataset_benchmark([TaskLabelledImages(*images(c, "train")) for c in SPLITS],
                             [TaskLabelledImages(*images(c, "test")) for c in SPLITS])


STREAMS: dict[str, Callable] = {
    "nc_benchmark": nc,
    "nc_benchmark-task_labels": lambda tmp_path: nc(tmp_path, task_labels=True),
    "ni_benchmark": ni,
    "dataset_benchmark": multi_dataset,
    "tensors_benchmark": tensors,
    "benchmark_from_datasets": from_datasets,
    "with_classes_timeline": classes_timeline,
    "class_incremental_benchmark": class_incremental,
    "new_instances_benchmark": new_instances,
    "task_incremental_benchmark": task_incremental,
    "benchmark_with_validation_stream": with_validation,
    "data_incremental_benchmark": data_incremental,
    "paths_benchmark": paths,
    "filelist_benchmark": filelists,
}

# Streams whose experiences carry distinct task labels (0, 1): router="oracle" applies.
TASK_LABELLED: dict[str, Callable] = {
    "nc_benchmark-task_labels": STREAMS["nc_benchmark-task_labels"],
    "tensors_benchmark-task_labels": lambda tmp_path: tensors(tmp_path, task_labels=(0, 1)),
    "task_incremental_benchmark": task_incremental,
}

# Streams whose experiences all have task label 0: router="oracle" cannot tell them apart.
UNLABELLED: dict[str, Callable] = {
    "nc_benchmark": nc,
    "tensors_benchmark": tensors,
    "benchmark_from_datasets": from_datasets,
}


# ---------------------------------------------------------------------------------- results


def metric_stream_name(stream) -> str:
    """How Avalanche's metric keys (and EarlyStoppingPlugin's ``val_stream_name``) name a stream."""
    return f"{stream.name}_stream"


def stream_accuracy(results: dict, stream) -> float:
    """The stream accuracy in ``results`` (Avalanche may suffix the key with a task label)."""
    prefix = f"Top1_Acc_Stream/eval_phase/{metric_stream_name(stream)}"
    values = [value for key, value in results.items() if key == prefix or key.startswith(prefix + "/")]
    assert len(values) == 1, f"expected one {prefix} value in {sorted(results)}"
    return float(values[0])


def train_stream_and_eval(strategy, benchmark, **train_kwargs) -> float:
    for experience in benchmark.train_stream:
        strategy.train(experience, **train_kwargs)
    return stream_accuracy(strategy.eval(benchmark.test_stream), benchmark.test_stream)


def is_finite(value) -> bool:
    if isinstance(value, torch.Tensor):
        return bool(torch.isfinite(value).all())
    if isinstance(value, dict):
        return all(is_finite(v) for v in value.values())
    return math.isfinite(float(value))
