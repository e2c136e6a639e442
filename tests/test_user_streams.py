"""Any backbone on any stream, and the user's own data in the runner: the digits at a backbone's input size
(and, with the digits backbone, exactly as before), image-folder trees, and a ``module:function`` benchmark,
each through ``run_comparison`` with a tiny backbone."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from avalanche.benchmarks import tensors_benchmark
from PIL import Image

from avalanche_color.benchmarks import digits
from avalanche_color.benchmarks.registry import BENCHMARKS
from avalanche_color.benchmarks.requests import SettingError
from avalanche_color.benchmarks.user_data import class_groups, image_folder_class, image_folder_domain
from avalanche_color.runner import RunConfig
from avalanche_color.runner.backbone_loading import load_backbone
from avalanche_color.runner.cli import main
from avalanche_color.runner.comparison import run_comparison
from avalanche_color.runner.run import build_stream


def samples(stream) -> list[tuple[torch.Tensor, torch.Tensor, list[int]]]:
    """Each experience's images, labels and task labels, as its dataset gives them."""
    out = []
    for experience in stream:
        items = [experience.dataset[index] for index in range(len(experience.dataset))]
        out.append((torch.stack([item[0] for item in items]), torch.tensor([int(item[1]) for item in items]),
                    sorted({int(item[2]) for item in items})))
    return out


def todays_digits(kind: str, seed: int, task_labels: bool):
    """The digits streams as they were built before they took a backbone's input size and normalisation."""
    split = digits.digits_split(seed)
    train, test = [], []
    if kind == "digits_class":
        for first in range(0, 10, 2):
            classes = torch.arange(first, first + 2)
            for (images, labels), store in ((split.train, train), (split.test, test)):
                keep = torch.isin(labels, classes)
                store.append(((images[keep] - 0.5) / 0.5, labels[keep]))
    else:
        for index, domain in enumerate(digits.DOMAINS):
            for (images, labels), store, salt in ((split.train, train, 0), (split.test, test, 1)):
                store.append(((digits.in_domain(images, domain, seed=2 * index + salt) - 0.5) / 0.5, labels))
    return tensors_benchmark(train, test, task_labels=list(range(len(train))) if task_labels else [0] * len(train))


@pytest.mark.parametrize("benchmark", ["digits_class", "digits_domain"])
def test_the_digits_with_the_digits_backbone_are_the_streams_the_committed_tables_were_made_on(benchmark):
    backbone = load_backbone("digits")
    for seed, task_labels in ((0, False), (1, True)):
        config = RunConfig(benchmark=benchmark)
        now = build_stream(BENCHMARKS[benchmark], config, backbone, seed, task_labels)
        before = todays_digits(benchmark, seed, task_labels)
        for stream in ("train_stream", "test_stream"):
            got, expected = samples(getattr(now, stream)), samples(getattr(before, stream))
            assert len(got) == len(expected)
            for (images, labels, tasks), (images_before, labels_before, tasks_before) in zip(got, expected):
                assert torch.equal(images, images_before) and torch.equal(labels, labels_before)
                assert tasks == tasks_before


def test_the_digits_take_a_larger_backbones_input_and_its_normalisation(tiny_backbone):
    small = load_backbone("digits")
    large = load_backbone(tiny_backbone, image_size=32)
    config = RunConfig(benchmark="digits_class", normalisation="imagenet")
    at_16 = samples(build_stream(BENCHMARKS["digits_class"], RunConfig(benchmark="digits_class"), small, 0,
                                 False).test_stream)
    at_32 = samples(build_stream(BENCHMARKS["digits_class"], config, large, 0, False).test_stream)
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(
        1, 3, 1, 1)
    for (images_16, labels_16, _), (images_32, labels_32, _) in zip(at_16, at_32):
        assert images_32.shape[1:] == (3, 32, 32) and torch.equal(labels_16, labels_32)
        # Back in [0, 1] and down to 16 px, the large images are the small ones.
        plain_16 = images_16 * 0.5 + 0.5
        plain_32 = torch.nn.functional.avg_pool2d(images_32 * std + mean, 2)
        assert (plain_32 - plain_16).abs().mean() < 0.03
        assert not torch.allclose(images_32[:, 0].mean(), images_32[:, 2].mean())  # per-channel normalisation


def test_the_digits_run_on_a_backbone_of_another_input_size(tiny_backbone, tmp_path):
    result = run_comparison(RunConfig(benchmark="digits_class", methods=("CoLoR",), backbone=tiny_backbone,
                                      image_size=32, epochs=1, ranks=(2,), loggers=(), out=tmp_path / "out"),
                            progress=False)
    assert result["backbone_source"]["input_size"] == [3, 32, 32]
    assert len(result["runs"][0]["accuracy_matrix"]) == 5 and (tmp_path / "out" / "results.json").is_file()


# ---------------------------------------------------------------------- image folders


def write_images(folder: Path, label: int, count: int, seed: int, size: int = 12) -> None:
    """``count`` PNG images of class ``label``: a colour per class, with noise."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    colour = np.array([(label * 70) % 256, (label * 130 + 40) % 256, (label * 200 + 90) % 256])
    for index in range(count):
        pixels = np.clip(colour + rng.normal(0, 20, (size, size, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{index}.png")


CLASSES = ("ant", "bee", "cat", "dog", "eel")


def class_tree(root: Path, classes=CLASSES, train: int = 6, test: int = 3) -> Path:
    for label, name in enumerate(classes):
        write_images(root / "train" / name, label, train, seed=label)
        write_images(root / "test" / name, label, test, seed=100 + label)
    return root


def domain_tree(root: Path) -> Path:
    for index, domain in enumerate(("photo", "sketch")):
        for label, name in enumerate(CLASSES[:3]):
            write_images(root / domain / "train" / name, label + index, 6, seed=10 * index + label)
            write_images(root / domain / "test" / name, label + index, 2, seed=50 + 10 * index + label)
    return root


@pytest.mark.parametrize("count, experiences", [(5, 2), (5, 5), (6, None), (1, None), (7, 3)])
def test_classes_split_into_consecutive_experiences(count, experiences):
    groups = class_groups(count, experiences)
    assert sum(groups, []) == list(range(count))
    assert len(groups) == (experiences or max(1, count // 2))
    sizes = [len(group) for group in groups]
    assert sizes == sorted(sizes, reverse=True) and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("experiences", [0, 6])
def test_more_experiences_than_classes_are_refused(experiences):
    with pytest.raises(SettingError, match=f"experiences must be an integer from 1 to the 5 classes.*got {experiences}"):
        class_groups(5, experiences)


def test_an_image_folder_tree_is_split_by_class_in_the_order_of_their_names(tmp_path):
    root = class_tree(tmp_path / "tree")
    stream = image_folder_class(root, experiences=2, image_size=16, task_labels=True)
    train, test = samples(stream.train_stream), samples(stream.test_stream)
    assert [labels.unique().tolist() for _, labels, _ in train] == [[0, 1, 2], [3, 4]]
    assert [labels.unique().tolist() for _, labels, _ in test] == [[0, 1, 2], [3, 4]]
    assert [len(labels) for _, labels, _ in train] == [18, 12] and [tasks for *_, tasks in train] == [[0], [1]]
    assert all(images.shape[1:] == (3, 16, 16) for images, _, _ in test)
    # Class i is the i-th name: its evaluated images are its colour (the same for train and test).
    means = {int(label): images[labels == label].mean((0, 2, 3)) for images, labels, _ in test for label in
             labels.unique()}
    colour = lambda label: (torch.tensor([(label * 70) % 256, (label * 130 + 40) % 256,  # noqa: E731
                                          (label * 200 + 90) % 256]) / 255 - 0.5) / 0.5
    assert all(torch.allclose(means[label], colour(label), atol=0.08) for label in means)
    fewer = image_folder_class(root, experiences=2, image_size=16, train_per_class=2, seed=3)
    assert [len(experience.dataset) for experience in fewer.train_stream] == [6, 4]


def test_an_image_folder_per_domain_is_one_experience_each_in_one_class_space(tmp_path):
    root = domain_tree(tmp_path / "domains")
    (root / "sketch" / "train" / "zebra").mkdir()  # a class only one domain has: the union labels it
    write_images(root / "sketch" / "train" / "zebra", 7, 2, seed=9)
    stream = image_folder_domain(root, image_size=16)
    train = samples(stream.train_stream)
    assert [labels.unique().tolist() for _, labels, _ in train] == [[0, 1, 2], [0, 1, 2, 3]]
    assert [len(experience.dataset) for experience in stream.test_stream] == [6, 6]


def test_image_folder_layouts_that_do_not_fit_are_refused_naming_the_folder(tmp_path):
    root = class_tree(tmp_path / "tree", classes=CLASSES[:2])
    write_images(root / "test" / "fox", 3, 1, seed=0)
    with pytest.raises(ValueError, match=r"test'? has classes with no training folder: \['fox'\]"):
        image_folder_class(root)
    (root / "train" / "empty").mkdir()
    with pytest.raises(ValueError, match="class folder .*empty' holds no images"):
        image_folder_class(root)
    with pytest.raises(FileNotFoundError, match=r"train' does not exist: expected DIR/train/<class>/<image>"):
        image_folder_class(root / "test")
    with pytest.raises(ValueError, match="needs a train/ and a test/ folder"):
        image_folder_domain(root / "train")  # class folders where domains should be


@pytest.mark.parametrize("benchmark", ["image_folder_class", "image_folder_domain"])
def test_an_image_folder_runs_through_the_comparison(benchmark, tiny_backbone, tmp_path, one_thread):
    root = class_tree(tmp_path / "tree") if benchmark == "image_folder_class" else domain_tree(tmp_path / "tree")
    settings = dict(experiences=3) if benchmark == "image_folder_class" else {}
    result = run_comparison(RunConfig(benchmark=benchmark, data=root, methods=("CoLoR", "CoLoR-oracle"),
                                      backbone=tiny_backbone, epochs=1, batch_size=8, ranks=(2,), loggers=(),
                                      out=tmp_path / "out", **settings), progress=False)
    experiences = 3 if benchmark == "image_folder_class" else 2
    for run in result["runs"]:
        assert len(run["accuracy_matrix"]) == experiences and 0 <= run["average_accuracy"] <= 1
    color = result["runs"][0]
    assert color["k"] == (2 * 2 if benchmark == "image_folder_class" else 5)  # the paper's rule on the measured data
    assert (tmp_path / "out" / "results.json").is_file() and not (tmp_path / "out" / "attempt").exists()
    assert f"{benchmark} ({'class' if experiences == 3 else 'domain'}-incremental)" in (
        tmp_path / "out" / "summary.md").read_text()


def test_flags_an_image_folder_takes_are_refused_elsewhere_naming_the_benchmarks_that_take_them(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "--benchmark", "pacs", "--experiences", "3", "--out-dir", str(tmp_path / "runs")])
    assert str(exit_.value) == ("avalanche-color compare: error: --experiences 3: is not supported for pacs: only "
                                "image_folder_class take it")
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "--benchmark", "image_folder_class", "--out-dir", str(tmp_path / "runs")])
    assert "--data: benchmark 'image_folder_class' needs --data" in str(exit_.value)
    class_tree(tmp_path / "tree", classes=CLASSES[:2])
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "--benchmark", "image_folder_class", "--data", str(tmp_path / "tree"), "--experiences",
              "3", "--out-dir", str(tmp_path / "runs")])
    assert "error: --experiences 3: experiences must be an integer from 1 to the 2 classes" in str(exit_.value)
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------- a function returning a benchmark


MODULE = '''
    import torch
    from avalanche.benchmarks import tensors_benchmark

    CALLS = []


    def make(image_size, mean, std, seed=0, task_labels=False):
        """Two experiences of two classes each: class c's images are all c / 4, normalised."""
        CALLS.append(dict(image_size=image_size, mean=mean, std=std, seed=seed, task_labels=task_labels))
        generator = torch.Generator().manual_seed(seed)
        mean, std = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)

        def part(classes, count):
            labels = torch.tensor(classes).repeat_interleave(count)
            images = labels.view(-1, 1, 1, 1) / 4 + 0.05 * torch.randn(len(labels), 3, image_size, image_size,
                                                                       generator=generator)
            return (images - mean) / std, labels

        train = [part([0, 1], 8), part([2, 3], 8)]
        test = [part([0, 1], 3), part([2, 3], 3)]
        return tensors_benchmark(train, test, task_labels=[0, 1] if task_labels else [0, 0])


    def fixed_size():
        return tensors_benchmark([(torch.zeros(4, 3, 8, 8), torch.tensor([0, 1, 0, 1]))],
                                 [(torch.zeros(2, 3, 8, 8), torch.tensor([0, 1]))], task_labels=[0])


    def not_a_benchmark(image_size):
        return [image_size]
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module ``my_streams`` in the folder the command runs from."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "my_streams.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.chdir(folder)
    monkeypatch.delitem(__import__("sys").modules, "my_streams", raising=False)
    yield folder
    __import__("sys").modules.pop("my_streams", None)


def test_a_function_returning_a_benchmark_runs_through_the_command(user_module, tiny_backbone, one_thread):
    main(["compare", "--benchmark", "my_streams:make", "--methods", "CoLoR", "CoLoR-oracle", "--epochs",
          "1", "--batch-size", "8", "--rank", "2", "--backbone", tiny_backbone, "--loggers", "--quiet"])
    import my_streams

    # Called with the backbone's input size and normalisation, per seed, with and without task labels.
    assert {call["task_labels"] for call in my_streams.CALLS} == {False, True}
    assert all((call["image_size"], call["mean"], call["std"]) == (16, (0.5,) * 3, (0.5,) * 3)
               for call in my_streams.CALLS)
    result = json.loads((user_module / "runs" / "my_streams_make" / "results.json").read_text())
    assert result["config"]["benchmark"] == "my_streams:make"
    assert [run["k"] for run in result["runs"]] == [4, 4]  # class-incremental, 2 classes per experience
    oracle = result["runs"][1]
    assert [[value is None for value in row] for row in oracle["accuracy_matrix"]] == [[False, True], [False, False]]
    assert "my_streams:make (class-incremental)" in (user_module / "runs" / "my_streams_make" / "summary.md").read_text()


@pytest.mark.parametrize("benchmark, flags, message", [
    ("no_such_module:make", [], "--benchmark no_such_module:make: module 'no_such_module' cannot be found"),
    ("my_streams:missing", [], "--benchmark my_streams:missing: my_streams has no 'missing': name a function"),
    ("my_streams:CALLS", [], "--benchmark my_streams:CALLS: my_streams:CALLS is a list, not a function"),
    ("my_streams:not_a_benchmark", [], "--benchmark my_streams:not_a_benchmark: benchmark my_streams:not_a_benchmark "
                                       "returned a list, not an Avalanche benchmark"),
    ("my_streams:fixed_size", ["--methods", "NCM"], "--benchmark my_streams:fixed_size: gives images of shape "
                                                    "(3, 8, 8) in its train_stream, but the backbone takes (3, 16, 16)"),
    ("my_streams:fixed_size", ["--methods", "CoLoR-oracle"], "--methods CoLoR-oracle: the methods that route by "
                                                             "task label need my_streams:fixed_size to take a "
                                                             "task_labels keyword"),
    ("my_streams:make", ["--data", "."], "--data .: benchmark my_streams:make takes no data keyword"),
    ("my_streams:make", ["--augmentation", "light"], "--augmentation light: is not supported for my_streams:make"),
    ("not a name", [], "--benchmark not a name: must be one of ["),
])
def test_a_function_that_cannot_give_a_stream_is_refused_in_one_line_before_anything_is_written(
        user_module, tiny_backbone, benchmark, flags, message):
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "--benchmark", benchmark, "--backbone", tiny_backbone, *flags, "--out-dir", "runs"])
    text = str(exit_.value)
    assert "\n" not in text and text.startswith(f"avalanche-color compare: error: {message}"), text
    assert not (user_module / "runs").exists()
