"""Loader options: worker processes and pinned memory for every loader of a strategy, checked once."""

import inspect

import pytest
import torch
from torch.utils.data import DataLoader

from avalanche_color import CoLoR, L2P, SPrompts
from helpers import stream_metric, tiny_color, train_all
from streams import class_stream, tiny_vit


@pytest.fixture
def loaded(monkeypatch) -> list[tuple[int, bool, bool]]:
    """(num_workers, pin_memory, persistent_workers) of every DataLoader that loads data while the test
    runs (Avalanche also builds loaders without workers only to size its samplers; those never load)."""
    iterated = []
    original = DataLoader.__iter__

    def recording(self):
        iterated.append((self.num_workers, self.pin_memory, self.persistent_workers))
        return original(self)

    monkeypatch.setattr(DataLoader, "__iter__", recording)
    return iterated


@pytest.mark.parametrize("options", [dict(), dict(router="gaussian", prototype_data="eval")])
def test_two_workers_give_the_results_of_loading_in_process(options, one_thread):
    runs = []
    for workers in (0, 2):
        strategy = tiny_color(0, train_epochs=1, num_workers=workers, persistent_workers=workers > 0, **options)
        runs.append((train_all(strategy, class_stream()), strategy.model.experts_state_dict()))
    (metrics, state), (metrics_with_workers, state_with_workers) = runs
    assert metrics == metrics_with_workers and 0.25 < stream_metric(metrics, "Top1_Acc") < 1
    assert state.keys() == state_with_workers.keys()
    assert all(torch.equal(state[key], state_with_workers[key]) for key in state)


def test_every_loader_of_training_and_evaluation_takes_the_options(loaded, one_thread):
    strategy = tiny_color(0, train_epochs=1, num_workers=2, persistent_workers=True)
    train_all(strategy, class_stream())
    # Per experience: the data scan, the training epoch, the prototype pass; then the evaluation loaders.
    assert len(loaded) >= 3 * 2 + 2
    assert {workers for workers, _, _ in loaded} == {2} and {pin for _, pin, _ in loaded} == {False}
    # Only the scan, one pass over each experience, does without persistent workers.
    assert sum(persistent for _, _, persistent in loaded) == len(loaded) - 2


def test_keywords_of_a_train_or_eval_call_replace_the_options_for_that_call(loaded, one_thread):
    strategy = tiny_color(0, train_epochs=1)
    benchmark = class_stream()
    strategy.train(benchmark.train_stream[0], num_workers=2)
    training = list(loaded)
    loaded.clear()
    strategy.eval(benchmark.test_stream)
    assert len(training) >= 3 and set(training) == {(2, False, False)}
    assert loaded and set(loaded) == {(0, False, False)}


@pytest.mark.parametrize("options, message", [
    (dict(num_workers=-1), "num_workers must be an integer >= 0, got -1"),
    (dict(num_workers=1.5), "num_workers must be an integer >= 0, got 1.5"),
    (dict(pin_memory="yes"), "pin_memory must be True or False, got 'yes'"),
    (dict(persistent_workers=1), "persistent_workers must be True or False, got 1"),
    (dict(persistent_workers=True), "persistent_workers=True .* needs num_workers >= 1, got num_workers=0"),
])
@pytest.mark.parametrize("strategy_class", [CoLoR, SPrompts, L2P])
def test_bad_loader_options_are_refused_naming_them(strategy_class, options, message):
    with pytest.raises(ValueError, match=message):
        strategy_class(tiny_vit(0), **options)


def test_bad_loader_keywords_of_a_call_are_refused_before_training():
    strategy = tiny_color(0, train_epochs=1, num_workers=2, persistent_workers=True)
    experience = class_stream().train_stream[0]
    with pytest.raises(ValueError, match="num_workers must be an integer >= 0, got '2'"):
        strategy.train(experience, num_workers="2")
    with pytest.raises(ValueError, match="persistent_workers=True .* got num_workers=0"):
        strategy.train(experience, num_workers=0)
    assert strategy.model.num_experts == 0


@pytest.mark.parametrize("strategy_class", [CoLoR, SPrompts, L2P])
def test_loader_options_show_in_the_signature_with_safe_defaults(strategy_class):
    parameters = inspect.signature(strategy_class).parameters
    defaults = {name: parameters[name].default for name in ("num_workers", "pin_memory", "persistent_workers")}
    assert defaults == {"num_workers": 0, "pin_memory": None, "persistent_workers": False}


@pytest.mark.parametrize("method", ["CoLoR", "Naive", "NCM", "RanPAC", "Joint-FT"])
def test_the_comparison_runner_gives_its_workers_to_every_loader_of_every_method(method, tiny_backbone, tmp_path,
                                                                                   loaded, one_thread):
    from avalanche_color.runner import RunConfig, run_comparison

    run_comparison(RunConfig(benchmark="digits_class", methods=(method,), epochs=1, batch_size=64,
                             backbone=tiny_backbone, out=tmp_path, ranks=(2,), ridge_width=64, workers=2),
                   progress=False)
    assert loaded and {workers for workers, _, _ in loaded} == {2}
    with pytest.raises(ValueError, match="workers must be an integer >= 0, got -1"):
        RunConfig(benchmark="digits_class", workers=-1)


def test_the_perf_loader_rows_load_transformed_photos():
    import io

    from PIL import Image

    from benchmarks.perf.workloads import JPEGDataset, jpeg_photos, load_epoch, paper_train_transform, training_loader

    photos = jpeg_photos(3, size=(64, 48))
    assert {Image.open(io.BytesIO(photo)).size for photo in photos} == {(64, 48)}
    dataset = JPEGDataset(photos, 10, paper_train_transform(32, (0.5,) * 3, (0.5,) * 3), classes=4)
    image, label = dataset[5]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and label == 1
    assert -1 <= float(image.min()) < float(image.max()) <= 1
    assert load_epoch(training_loader(dataset, 4, 2, torch.device("cpu")), torch.device("cpu")) == 10
