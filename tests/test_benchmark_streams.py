"""The benchmark streams on tiny fake copies of their data sets (made here, never the real archives).

Properties checked: experience count and order, the classes of each experience, train/test
disjointness, seeded splits, task labels, what the transforms give, and clear errors.
"""

from __future__ import annotations

import io
import zipfile
from collections import Counter
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

import avalanche_color.benchmarks.archives
import avalanche_color.benchmarks.pacs
from avalanche_color.benchmarks.pacs import PACS_CLASSES, PACS_DOMAINS, load_pacs, pacs
from avalanche_color.benchmarks.paper import DOMAINNET_DOMAINS, core50_ni, domainnet, split_cifar100
from avalanche_color.benchmarks.registry import benchmark_spec
from avalanche_color.benchmarks.requests import StreamRequest
from avalanche_color.benchmarks.tiny_imagenet import split_tiny_imagenet
from avalanche_color.benchmarks.transforms import paper_transforms, vit_transforms
from paper_data import jpeg, use_md5_sums, write_cifar100, write_core50, write_domainnet

SIZE = 16  # the images' side in the streams (PACS and DomainNet); Tiny-ImageNet uses TINY_SIZE
TINY_SIZE = 8
NORM = dict(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
PACS_PER_CLASS = {domain: 4 + i for i, domain in enumerate(PACS_DOMAINS)}  # sizes tell domains apart
TINY_TRAIN, TINY_VAL = 3, 1  # images per class


def png_of_class(rng: np.random.Generator, position: int) -> bytes:
    """A noise image whose top-left red value is ``position`` (PNG: exact, whatever the file suffix)."""
    pixels = rng.integers(0, 256, (TINY_SIZE, TINY_SIZE, 3), dtype=np.uint8)
    pixels[0, 0, 0] = position
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def pacs_zip(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pacs") / "pacs.zip"
    rng = np.random.default_rng(0)
    with zipfile.ZipFile(path, "w") as archive:
        for domain in PACS_DOMAINS:
            for label in PACS_CLASSES:
                for i in range(PACS_PER_CLASS[domain]):
                    archive.writestr(f"top/PACS/{domain}/{label}/{label}_{i}.jpg", jpeg(rng))
        archive.writestr("__MACOSX/top/PACS/photo/dog/._dog_0.jpg", b"not an image")  # must be skipped
    return path


@pytest.fixture(scope="module")
def tiny_imagenet(tmp_path_factory) -> Path:
    """A folder holding the official ``tiny-imagenet-200/`` layout with 200 classes (2-4 images each);
    the top-left red value of an image is its class's position in ``wnids.txt``."""
    folder = tmp_path_factory.mktemp("tiny")
    root = folder / "tiny-imagenet-200"
    rng = np.random.default_rng(0)
    wnids = [f"n{i:08d}" for i in range(200)]
    (root / "val" / "images").mkdir(parents=True)
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    annotations = []
    for position, wnid in enumerate(wnids):
        images = root / "train" / wnid / "images"
        images.mkdir(parents=True)
        for i in range(TINY_TRAIN):
            (images / f"{wnid}_{i}.JPEG").write_bytes(png_of_class(rng, position))
        for i in range(TINY_VAL):
            name = f"val_{position}_{i}.JPEG"
            (root / "val" / "images" / name).write_bytes(png_of_class(rng, position))
            annotations.append(f"{name}\t{wnid}\t0\t0\t{TINY_SIZE}\t{TINY_SIZE}")
    (root / "val" / "val_annotations.txt").write_text("\n".join(annotations) + "\n")
    return folder


@pytest.fixture(scope="module")
def domainnet_root(tmp_path_factory) -> Path:
    """Two domains of the published layout, 3 classes, non-square images; 2 train + 1 test per class."""
    root = tmp_path_factory.mktemp("domainnet")
    write_domainnet(root, ("clipart", "real"))
    return root


def eval_images(dataset) -> set[bytes]:
    """The dataset's images under the (deterministic) eval transform, as comparable bytes."""
    return {sample[0].numpy().tobytes() for sample in dataset.eval()}


def classes(stream) -> list[set[int]]:
    return [set(experience.classes_in_this_experience) for experience in stream]


# --- transforms ---------------------------------------------------------------------------------


def test_eval_transform_normalises_uint8_tensors_and_pil_images_alike():
    _, evaluate = vit_transforms(SIZE, mean=(0.5, 0.4, 0.3), std=(0.5, 0.2, 0.25))
    image = torch.randint(0, 256, (3, SIZE, SIZE), dtype=torch.uint8)
    expected = (image.float() / 255 - torch.tensor([0.5, 0.4, 0.3]).view(3, 1, 1)) / torch.tensor(
        [0.5, 0.2, 0.25]).view(3, 1, 1)
    out = evaluate(image)
    assert type(out) is torch.Tensor and out.dtype == torch.float32
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(evaluate(Image.fromarray(image.permute(1, 2, 0).numpy())), expected)


def test_train_transform_is_random_with_the_same_shape_and_both_resize_other_sizes():
    train, evaluate = vit_transforms(SIZE, **NORM)
    image = torch.randint(0, 256, (3, 40, 30), dtype=torch.uint8)
    torch.manual_seed(0)
    draws = [train(image) for _ in range(10)]
    assert all(d.shape == (3, SIZE, SIZE) and d.dtype == torch.float32 for d in draws)
    assert len({d.numpy().tobytes() for d in draws}) > 1
    assert evaluate(image).shape == (3, SIZE, SIZE) and torch.equal(evaluate(image), evaluate(image))


@pytest.mark.parametrize("transforms", [vit_transforms, paper_transforms])
@pytest.mark.parametrize("arguments, message", [
    ((0, (0.5,) * 3, (0.5,) * 3), "image_size must be a positive int, got 0"),
    ((SIZE, (0.5, 0.5), (0.5,) * 3), r"mean must be 3 numbers .*got \(0.5, 0.5\)"),
    ((SIZE, (0.5,) * 3, (0.5, 0.0, 0.5)), "std must be positive"),
])
def test_transforms_refuse_bad_arguments(transforms, arguments, message):
    with pytest.raises(ValueError, match=message):
        transforms(*arguments)


def test_paper_transforms_are_s_prompts_random_resized_crop_and_flip_then_resize_256_and_centre_crop_224():
    train, evaluate = paper_transforms(224, **NORM)
    steps = {type(step).__name__: step for step in train.transforms}
    assert list(steps)[1:3] == ["RandomResizedCrop", "RandomHorizontalFlip"]
    assert steps["RandomResizedCrop"].size == (224, 224) and steps["RandomResizedCrop"].scale == (0.08, 1.0)
    resize, crop = evaluate.transforms[1:3]
    assert (type(resize).__name__, resize.size, type(crop).__name__, crop.size) == ("Resize", [256], "CenterCrop",
                                                                                     (224, 224))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8))
    expected = v2.functional.center_crop(v2.functional.resize(v2.functional.to_image(image), [256]), [224, 224])
    torch.testing.assert_close(evaluate(image), (expected.float() / 255 - 0.5) / 0.5)
    torch.manual_seed(0)
    draws = [train(image) for _ in range(5)]
    assert all(d.shape == (3, 224, 224) for d in draws) and len({d.numpy().tobytes() for d in draws}) == 5
    small_train, small_eval = paper_transforms(32, **NORM)  # scaled alike for a smaller ViT: Resize(37), crop 32
    assert small_eval.transforms[1].size == [37] and small_eval(image).shape == small_train(image).shape == (3, 32, 32)


# --- PACS -----------------------------------------------------------------------------------------


def test_pacs_has_one_experience_per_domain_in_the_given_order_with_all_classes(pacs_zip, cache):
    domains = ("sketch", "art_painting", "photo")
    benchmark = pacs(pacs_zip, image_size=SIZE, domains=domains, cache_dir=cache, **NORM)
    assert len(benchmark.train_stream) == len(benchmark.test_stream) == 3
    assert classes(benchmark.train_stream) == classes(benchmark.test_stream) == [set(range(7))] * 3
    for experience, test, domain in zip(benchmark.train_stream, benchmark.test_stream, domains):
        per_class = PACS_PER_CLASS[domain]
        assert Counter(test.dataset.targets) == {label: 1 for label in range(7)}  # 20% of 4-7, stratified
        assert Counter(experience.dataset.targets) == {label: per_class - 1 for label in range(7)}


def test_pacs_split_is_disjoint_seeded_and_independent_of_the_other_domains(pacs_zip, cache):
    def split(seed, domains=PACS_DOMAINS):
        benchmark = pacs(pacs_zip, image_size=SIZE, seed=seed, domains=domains, cache_dir=cache, **NORM)
        position = domains.index("photo")
        return (eval_images(benchmark.train_stream[position].dataset),
                eval_images(benchmark.test_stream[position].dataset))

    train, test = split(0)
    assert len(train) + len(test) == 7 * PACS_PER_CLASS["photo"] and not train & test
    assert split(0) == (train, test)
    assert split(0, ("photo", "cartoon")) == (train, test)
    assert split(1)[1] != test


def test_pacs_test_fraction(pacs_zip, cache):
    benchmark = pacs(pacs_zip, image_size=SIZE, test_fraction=0.5, domains=("sketch",), cache_dir=cache, **NORM)
    assert Counter(benchmark.test_stream[0].dataset.targets) == {label: 4 for label in range(7)}  # 7 per class


def test_pacs_samples_are_transformed_per_stream(pacs_zip, cache):
    benchmark = pacs(pacs_zip, image_size=SIZE, domains=("photo",), cache_dir=cache, **NORM)
    train, test = benchmark.train_stream[0].dataset, benchmark.test_stream[0].dataset
    x, y, t = train[0]
    assert x.shape == (3, SIZE, SIZE) and x.dtype == torch.float32 and isinstance(y, int) and t == 0
    assert torch.equal(test[0][0], test[0][0])  # eval: deterministic
    assert test[0][0].min() >= -1 and test[0][0].max() <= 1
    torch.manual_seed(0)
    assert len({train[0][0].numpy().tobytes() for _ in range(10)}) > 1  # train: augmented


def test_pacs_decodes_once_into_the_cache(pacs_zip, tmp_path, monkeypatch):
    pacs(pacs_zip, image_size=SIZE, domains=("photo",), cache_dir=tmp_path, **NORM)
    assert len(list(tmp_path.glob(f"pacs_*_{SIZE}px.pt"))) == 1
    data = load_pacs(pacs_zip, image_size=SIZE, cache_dir=tmp_path)
    assert data["images"].dtype == torch.uint8 and data["images"].shape[1:] == (3, SIZE, SIZE)
    assert len(data["labels"]) == 7 * sum(PACS_PER_CLASS.values())  # the __MACOSX entry is skipped
    monkeypatch.setattr(avalanche_color.benchmarks.pacs, "decode_images", lambda *a: pytest.fail("decoded again"))
    pacs(pacs_zip, image_size=SIZE, domains=("photo",), cache_dir=tmp_path, **NORM)


def test_images_are_cached_at_most_at_their_stored_size_and_enlarged_by_the_transforms(pacs_zip, tmp_path):
    stored = 64  # the fixture's JPEGs
    data = load_pacs(pacs_zip, image_size=2 * stored, cache_dir=tmp_path)
    assert data["images"].shape[1:] == (3, stored, stored)  # not enlarged in the cache
    bilinear = pacs(pacs_zip, image_size=2 * stored, domains=("photo",), cache_dir=tmp_path, **NORM)
    bicubic = pacs(pacs_zip, image_size=2 * stored, domains=("photo",), cache_dir=tmp_path,
                   interpolation="bicubic", **NORM)
    x, y = bilinear.test_stream[0].dataset[0][0], bicubic.test_stream[0].dataset[0][0]
    assert x.shape == y.shape == (3, 2 * stored, 2 * stored)
    assert not torch.equal(x, y)  # the backbone's interpolation is the one used
    assert {p.name.endswith("_bicubic.pt") for p in tmp_path.glob("pacs_*.pt")} == {False, True}
    with pytest.raises(ValueError, match="interpolation must be one of .* got 'sinc'"):
        pacs(pacs_zip, image_size=SIZE, cache_dir=tmp_path, interpolation="sinc", **NORM)


def test_pacs_train_per_class_keeps_each_domain_s_classes_and_the_test_split(pacs_zip, cache):
    whole = pacs(pacs_zip, image_size=SIZE, seed=1, cache_dir=cache, **NORM)
    few = pacs(pacs_zip, image_size=SIZE, seed=1, train_per_class=2, cache_dir=cache, **NORM)
    for a, b in zip(whole.train_stream, few.train_stream):
        counts = torch.as_tensor(list(b.dataset.targets)).unique(return_counts=True)[1]
        assert counts.tolist() == [2] * len(PACS_CLASSES) and len(a.dataset) > len(b.dataset)
    assert [eval_images(e.dataset) for e in whole.test_stream] == [eval_images(e.dataset) for e in few.test_stream]
    with pytest.raises(ValueError, match="train_per_class must be a positive int or None, got 0"):
        pacs(pacs_zip, image_size=SIZE, train_per_class=0, cache_dir=cache, **NORM)


def test_pacs_reads_an_unpacked_folder(pacs_zip, tmp_path, cache):
    with zipfile.ZipFile(pacs_zip) as archive:
        archive.extractall(tmp_path / "unpacked")
    from_folder = pacs(tmp_path / "unpacked", image_size=SIZE, domains=("cartoon",), cache_dir=cache, **NORM)
    from_zip = pacs(pacs_zip, image_size=SIZE, domains=("cartoon",), cache_dir=cache, **NORM)
    assert eval_images(from_folder.test_stream[0].dataset) == eval_images(from_zip.test_stream[0].dataset)


@pytest.mark.parametrize("builder", ["pacs", "tiny"])
def test_task_labels_are_the_experience_index_or_zero(builder, pacs_zip, tiny_imagenet, cache):
    def build(task_labels):
        if builder == "pacs":
            return pacs(pacs_zip, image_size=SIZE, task_labels=task_labels, cache_dir=cache, **NORM)
        return split_tiny_imagenet(tiny_imagenet, image_size=TINY_SIZE, task_labels=task_labels,
                                   cache_dir=cache, **NORM)

    for task_labels in (False, True):
        benchmark = build(task_labels)
        for stream in (benchmark.train_stream, benchmark.test_stream):
            expected = [i if task_labels else 0 for i in range(len(stream))]
            assert [experience.task_label for experience in stream] == expected
            assert [experience.dataset[0][2] for experience in stream] == expected


@pytest.mark.parametrize("arguments, message", [
    (dict(seed=-1), "seed must be a non-negative int, got -1"),
    (dict(test_fraction=1.0), "test_fraction must be a number strictly between 0 and 1, got 1.0"),
    (dict(domains=("photo", "photo")), "domains must be distinct names from"),
    (dict(domains=("photos",)), r"domains must be distinct names from .*got \('photos',\)"),
    (dict(domains=()), "domains must be distinct names"),
    (dict(domains="photo"), "domains must be a sequence of names"),
    (dict(image_size=-4), "image_size must be a positive int"),
])
def test_pacs_refuses_bad_arguments(arguments, message, pacs_zip, cache):
    with pytest.raises(ValueError, match=message):
        pacs(pacs_zip, cache_dir=cache, **{"image_size": SIZE, **NORM, **arguments})


def test_pacs_missing_or_wrong_data_is_a_clear_error(tmp_path, cache):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        pacs(tmp_path / "missing.zip", image_size=SIZE, cache_dir=cache, **NORM)
    (tmp_path / "other" / "cats").mkdir(parents=True)
    (tmp_path / "other" / "cats" / "a.jpg").write_bytes(jpeg(np.random.default_rng(0)))
    with pytest.raises(FileNotFoundError, match=r"no PACS images .*PACS/<domain>/<class>/<name>.jpg"):
        pacs(tmp_path / "other", image_size=SIZE, cache_dir=cache, **NORM)


# --- Tiny-ImageNet --------------------------------------------------------------------------------


def red_code(image: torch.Tensor) -> int:
    """The top-left red value before normalisation with mean = std = 0.5."""
    return round(float(image[0, 0, 0] * 0.5 + 0.5) * 255)


def test_split_tiny_imagenet_holds_the_stream_classes_relabelled_in_file_order(tiny_imagenet, cache):
    benchmark = split_tiny_imagenet(tiny_imagenet, image_size=TINY_SIZE, cache_dir=cache, **NORM)
    expected = [set(range(10 * i, 10 * i + 10)) for i in range(10)]
    assert classes(benchmark.train_stream) == classes(benchmark.test_stream) == expected
    for stream, per_class in ((benchmark.train_stream, TINY_TRAIN), (benchmark.test_stream, TINY_VAL)):
        for experience in stream:
            dataset = experience.dataset.eval()
            assert len(dataset) == 10 * per_class
            # stream label c is wnids.txt position 100 + c: never a pretraining class
            assert all(red_code(x) == 100 + y for x, y, _ in dataset)
    train, test = benchmark.train_stream[3].dataset, benchmark.test_stream[3].dataset
    assert not eval_images(train) & eval_images(test)


def test_split_tiny_imagenet_reads_the_unpacked_folder_itself(tiny_imagenet, cache):
    inner = split_tiny_imagenet(tiny_imagenet / "tiny-imagenet-200", image_size=TINY_SIZE, cache_dir=cache, **NORM)
    outer = split_tiny_imagenet(tiny_imagenet, image_size=TINY_SIZE, cache_dir=cache, **NORM)
    for stream in ("train_stream", "test_stream"):
        assert eval_images(getattr(inner, stream)[9].dataset) == eval_images(getattr(outer, stream)[9].dataset)


def test_split_tiny_imagenet_experiences_and_train_per_class(tiny_imagenet, cache):
    five = split_tiny_imagenet(tiny_imagenet, experiences=5, image_size=TINY_SIZE, cache_dir=cache, **NORM)
    assert classes(five.train_stream) == [set(range(20 * i, 20 * i + 20)) for i in range(5)]

    def kept(seed):
        benchmark = split_tiny_imagenet(tiny_imagenet, image_size=TINY_SIZE, seed=seed, train_per_class=2,
                                        cache_dir=cache, **NORM)
        dataset = benchmark.train_stream[0].dataset
        assert Counter(dataset.targets) == {label: 2 for label in range(10)}
        assert len(benchmark.test_stream[0].dataset) == 10 * TINY_VAL  # the test data are not subsampled
        return eval_images(dataset)

    assert kept(0) == kept(0) and kept(0) != kept(1)


@pytest.mark.parametrize("arguments, message", [
    (dict(experiences=3), r"experiences must divide the 100 stream classes \(one of \[1, 2, 4, 5, 10, .*\]\), got 3"),
    (dict(train_per_class=0), "train_per_class must be a positive int or None, got 0"),
    (dict(seed=1.5), "seed must be a non-negative int, got 1.5"),
])
def test_split_tiny_imagenet_refuses_bad_arguments(arguments, message, tiny_imagenet, cache):
    with pytest.raises(ValueError, match=message):
        split_tiny_imagenet(tiny_imagenet, cache_dir=cache, **{"image_size": TINY_SIZE, **NORM, **arguments})


def test_split_tiny_imagenet_refuses_an_archive_without_200_classes(tmp_path, cache):
    with zipfile.ZipFile(tmp_path / "tiny.zip", "w") as archive:
        archive.writestr("tiny-imagenet-200/wnids.txt", "n1\nn2\nn3\n")
        archive.writestr("tiny-imagenet-200/val/val_annotations.txt", "")
    with pytest.raises(ValueError, match="lists 3 classes in wnids.txt, expected 200"):
        split_tiny_imagenet(tmp_path / "tiny.zip", image_size=TINY_SIZE, cache_dir=cache, **NORM)


def test_registry_builds_the_offline_streams_with_its_keywords(pacs_zip, tiny_imagenet, tmp_path, monkeypatch):
    monkeypatch.setattr(avalanche_color.benchmarks.archives, "CACHE_DIR", tmp_path)  # the default cache, read at call time
    benchmark = benchmark_spec("pacs").stream(StreamRequest(SIZE, data=pacs_zip, task_labels=True, **NORM))
    assert [e.task_label for e in benchmark.train_stream] == [0, 1, 2, 3]
    subsampled = benchmark_spec("pacs").stream(StreamRequest(SIZE, data=pacs_zip, train_per_class=1, **NORM))
    for whole, few in zip(benchmark.train_stream, subsampled.train_stream):  # one image of each class per domain
        assert sorted(few.dataset.targets) == sorted(set(whole.dataset.targets))
    for whole, same in zip(benchmark.test_stream, subsampled.test_stream):  # the test split does not move
        assert list(whole.dataset.targets) == list(same.dataset.targets)
    with pytest.raises(ValueError, match="train_per_class is not supported for digits_class: only pacs, "
                                         "split_tiny_imagenet, image_folder_class, image_folder_domain take it"):
        benchmark_spec("digits_class").stream(StreamRequest(SIZE, train_per_class=1, **NORM))
    benchmark = benchmark_spec("split_tiny_imagenet").stream(
        StreamRequest(TINY_SIZE, data=tiny_imagenet, train_per_class=1, **NORM))
    assert len(benchmark.train_stream) == 10 and len(benchmark.train_stream[0].dataset) == 10
    assert len(list(tmp_path.glob("*.pt"))) == 2


# --- DomainNet ------------------------------------------------------------------------------------


def test_domainnet_reads_the_published_layout_lazily(domainnet_root, monkeypatch):
    opened = []
    original_open = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(a[0]) or original_open(*a, **k))
    benchmark = domainnet(domainnet_root, image_size=SIZE, domains=("real", "clipart"), task_labels=True, **NORM)
    assert opened == []  # nothing is read until a sample is drawn
    assert len(benchmark.train_stream) == len(benchmark.test_stream) == 2
    assert [e.task_label for e in benchmark.train_stream] == [0, 1]
    assert classes(benchmark.train_stream) == classes(benchmark.test_stream) == [{0, 1, 2}] * 2
    train, test = benchmark.train_stream[0].dataset, benchmark.test_stream[0].dataset
    assert Counter(train.targets) == {0: 2, 1: 2, 2: 2} and Counter(test.targets) == {0: 1, 1: 1, 2: 1}
    x, y, t = test[0]
    assert x.shape == (3, SIZE, SIZE) and x.dtype == torch.float32 and t == 0
    assert len(opened) == 1 and "/real/" in str(opened[0])  # the first experience is the first domain given
    assert torch.equal(test[0][0], x)  # the test stream starts with the eval transform
    assert not eval_images(train) & eval_images(test)


def test_registry_passes_its_keywords_to_the_paper_streams(domainnet_root, cifar100_root, core50_root):
    def build(name, data):
        return benchmark_spec(name).stream(StreamRequest(SIZE, data=data, **NORM))

    with pytest.raises(ValueError, match="benchmark 'core50' needs --data"):
        build("core50", None)

    with pytest.raises(FileNotFoundError, match="infograph"):  # the registry asks for all six domains
        build("domainnet", domainnet_root)
    assert len(build("split_cifar100", cifar100_root).train_stream) == 10
    assert len(build("core50", core50_root).train_stream) == 8


def test_domainnet_missing_files_and_bad_lines_are_clear_errors(domainnet_root, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"clipart_test.txt' does not exist: expected <root>/<domain>/"):
        domainnet(_copy_without(domainnet_root, tmp_path / "a", "clipart_test.txt"), domains=("clipart",))
    with pytest.raises(FileNotFoundError, match="DomainNet image folder .*sketch' does not exist"):
        domainnet(domainnet_root, domains=("real", "sketch"))
    with pytest.raises(FileNotFoundError, match="DomainNet folder .*does not exist"):
        domainnet(tmp_path / "nowhere")
    broken = _copy_without(domainnet_root, tmp_path / "b", "real_train.txt")
    (broken / "real_train.txt").write_text("real/airplane/x.jpg 0\n\nreal/airplane/y.jpg\n")
    with pytest.raises(ValueError, match=r"real_train.txt:3: expected '<domain>/<class>/<file>.jpg <label>'"):
        domainnet(broken, domains=("real",))
    with pytest.raises(ValueError, match="domains must be distinct names from .*'quickdraw'"):
        domainnet(domainnet_root, domains=("photo",))
    assert len(DOMAINNET_DOMAINS) == 6


def _copy_without(root: Path, destination: Path, left_out: str) -> Path:
    for path in root.rglob("*"):
        if path.is_file() and path.name != left_out:
            (destination / path.relative_to(root)).parent.mkdir(parents=True, exist_ok=True)
            (destination / path.relative_to(root)).write_bytes(path.read_bytes())
    return destination


# --- Split CIFAR-100 and CORe50 (Avalanche's generators on fake local copies) -----------------------


@pytest.fixture
def cifar100_root(tmp_path, monkeypatch) -> Path:
    """``cifar-100-python`` in torchvision's pickled format, 2 train + 1 test images per class."""
    use_md5_sums(monkeypatch, write_cifar100(tmp_path))
    return tmp_path


def test_split_cifar100_has_10_experiences_of_10_contiguous_classes_in_cifar_order(cifar100_root):
    benchmark = split_cifar100(cifar100_root, image_size=SIZE, seed=0, **NORM)
    order = classes(benchmark.train_stream)
    assert order == [set(range(10 * i, 10 * i + 10)) for i in range(10)]  # the paper's, whatever the seed
    assert order == classes(benchmark.test_stream) == classes(split_cifar100(cifar100_root, image_size=SIZE, seed=1,
                                                                              **NORM).train_stream)
    assert [e.task_label for e in benchmark.train_stream] == [0] * 10
    x, y, t = benchmark.train_stream[0].dataset[0]
    assert x.shape == (3, SIZE, SIZE) and x.dtype == torch.float32 and y in order[0]
    shuffled = classes(split_cifar100(cifar100_root, image_size=SIZE, seed=1, shuffle_classes=True, **NORM)
                       .train_stream)
    assert shuffled != order and set().union(*shuffled) == set(range(100)) and all(len(c) == 10 for c in shuffled)
    assert shuffled == classes(split_cifar100(cifar100_root, image_size=SIZE, seed=1, shuffle_classes=True,
                                              **NORM).train_stream)
    other = split_cifar100(cifar100_root, image_size=SIZE, seed=1, task_labels=True, **NORM)
    assert [e.task_label for e in other.test_stream] == list(range(10))


def test_split_cifar100_that_cannot_be_downloaded_is_a_clear_error(tmp_path, monkeypatch):
    import torchvision.datasets.cifar

    def offline(*args, **kwargs):
        raise URLError("no network")

    monkeypatch.setattr(torchvision.datasets.cifar, "download_and_extract_archive", offline)
    with pytest.raises(FileNotFoundError, match=r"CIFAR-100 is not complete in .*no network.*cifar-100-python"):
        split_cifar100(tmp_path, image_size=SIZE, **NORM)


@pytest.fixture
def core50_root(tmp_path) -> Path:
    """CORe50's files for the NI scenario, run 0: 8 training sessions and a test set, 2 images each."""
    write_core50(tmp_path, objects=2)
    return tmp_path


def test_core50_ni_has_8_training_sessions_and_one_test_set(core50_root):
    benchmark = core50_ni(core50_root, image_size=SIZE, **NORM)
    assert len(benchmark.train_stream) == 8 and len(benchmark.test_stream) == 1
    assert [e.task_label for e in benchmark.train_stream] == [0] * 8
    x, y, t = benchmark.test_stream[0].dataset[0]
    assert x.shape == (3, SIZE, SIZE) and x.dtype == torch.float32 and (y, t) == (0, 0)
    with pytest.raises(ValueError, match="task_labels=True is not supported for core50"):
        core50_ni(core50_root, image_size=SIZE, task_labels=True, **NORM)


def test_core50_that_cannot_be_downloaded_is_a_clear_error(tmp_path, monkeypatch):
    from avalanche.benchmarks.datasets.core50.core50 import CORe50Dataset

    def offline(self):
        raise URLError("no network")

    monkeypatch.setattr(CORe50Dataset, "_download_dataset", offline)
    with pytest.raises(FileNotFoundError, match=r"CORe50 is not complete in .*no network.*core50_128x128"):
        core50_ni(tmp_path / "core50", image_size=SIZE, **NORM)


def test_data_location_from_the_argument_the_environment_or_a_download(tmp_path, monkeypatch):
    from avalanche_color.benchmarks import archives

    monkeypatch.delenv(archives.DATA_ENV, raising=False)
    monkeypatch.setattr(archives, "CACHE_DIR", tmp_path)  # downloads go to its downloads/ folder
    assert archives.data_path(tmp_path / "given.zip", "pacs.zip", "PACS", "") == tmp_path / "given.zip"
    with pytest.raises(FileNotFoundError, match="PACS is not given: pass --data PATH .* AVALANCHE_COLOR_DATA .* pacs.zip"):
        archives.data_path(None, "pacs.zip", "PACS", "PACS is published at somewhere")
    monkeypatch.setenv(archives.DATA_ENV, str(tmp_path))
    assert archives.data_path(None, "pacs.zip", "PACS", "") == tmp_path / "pacs.zip"
    monkeypatch.delenv(archives.DATA_ENV)

    fetched = []
    monkeypatch.setattr(archives, "download", lambda url, target: (fetched.append(url), target.parent.mkdir(),
                                                                    target.write_bytes(b"zip")))
    url = "http://example.org/data/tiny.zip"
    assert archives.data_path(None, "tiny-32px.zip", "Tiny", "", url) == tmp_path / "downloads" / "tiny.zip"
    assert archives.data_path(None, "tiny-32px.zip", "Tiny", "", url) == tmp_path / "downloads" / "tiny.zip"
    assert fetched == [url]  # downloaded once, then reused

    def offline(url, target):
        raise OSError("network is unreachable")
    monkeypatch.setattr(archives, "download", offline)
    with pytest.raises(FileNotFoundError, match="downloading http://example.org/other.zip failed .*unreachable.*--data"):
        archives.data_path(None, "tiny-32px.zip", "Tiny", "", "http://example.org/other.zip")


def test_a_damaged_zip_is_refused_naming_its_path(tmp_path):
    from avalanche_color.benchmarks.archives import Archive

    damaged = tmp_path / "pacs.zip"
    damaged.write_bytes(b"PK\x03\x04 and then nothing a zip reader can use")
    with pytest.raises(ValueError, match=f"data path '{damaged}' is not a readable zip file"):
        Archive(damaged)


def test_the_offline_streams_take_the_papers_augmentation_and_the_digits_refuse_it(pacs_zip, tmp_path, monkeypatch):
    from torchvision.transforms import v2

    from avalanche_color.benchmarks.transforms import offline_transforms

    monkeypatch.setattr(avalanche_color.benchmarks.archives, "CACHE_DIR", tmp_path)
    paper_train, paper_eval = offline_transforms("paper", SIZE, **NORM)
    assert isinstance(paper_train.transforms[1], v2.RandomResizedCrop)
    assert [type(step) for step in paper_eval.transforms[1:3]] == [v2.Resize, v2.CenterCrop]
    assert isinstance(offline_transforms("light", SIZE, **NORM)[0].transforms[2], v2.RandomCrop)
    with pytest.raises(ValueError, match=r"augmentation must be one of \('light', 'paper'\), got 'heavy'"):
        offline_transforms("heavy", SIZE, **NORM)

    def first_test_image(augmentation):
        request = StreamRequest(SIZE, data=pacs_zip, augmentation=augmentation, **NORM)
        return benchmark_spec("pacs").stream(request).test_stream[0].dataset[0][0]

    light, paper = first_test_image(None), first_test_image("paper")
    assert light.shape == paper.shape == (3, SIZE, SIZE)
    assert torch.equal(first_test_image("light"), light)  # the benchmark's own is the light one
    assert not torch.equal(light, paper)  # the paper's evaluation resizes by 256/224 and crops the centre
    with pytest.raises(ValueError, match="augmentation is not supported for digits_class, whose images go to the "
                                         "backbone as they are, got 'paper'"):
        benchmark_spec("digits_class").stream(StreamRequest(SIZE, augmentation="paper", **NORM))
    with pytest.raises(ValueError, match=r"augmentation must be one of \['paper'\] for domainnet, got 'light'"):
        benchmark_spec("domainnet").stream(StreamRequest(SIZE, augmentation="light", **NORM))
