"""The paper's three benchmarks end to end through the comparison runner, on tiny fake copies of
their data sets in the real on-disk formats, with a tiny random ViT (seconds each on CPU)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from benchmarks.compare import ComparisonConfig, run_comparison
from benchmarks.compare.config import methods_allowed
from benchmarks.compare.methods import METHODS
from benchmarks.streams.paper import DOMAINNET_DOMAINS
from helpers import saved_vit
from paper_data import use_md5_sums, write_cifar100, write_core50, write_domainnet

SMALL_VIT = dict(img_size=32, patch_size=16, embed_dim=16, depth=1, num_heads=2)


@pytest.fixture(scope="module")
def small_backbone(tmp_path_factory) -> str:
    """A seeded 1-block timm ViT for 32 px images (the fake data sets' size), saved as a backbone file."""
    return saved_vit(tmp_path_factory.mktemp("backbone") / "small_vit.pt", **SMALL_VIT)


def fake_data(benchmark: str, root: Path, monkeypatch) -> Path:
    """The benchmark's fake data set under ``root``."""
    if benchmark == "split_cifar100":
        use_md5_sums(monkeypatch, write_cifar100(root))
    elif benchmark == "core50":
        write_core50(root, objects=3)
    else:
        write_domainnet(root, DOMAINNET_DOMAINS)
    return root


def config(benchmark: str, data: Path, backbone: str, out: Path, **overrides) -> ComparisonConfig:
    # k=2 and a narrow ridge keep the k-means and the ridge solves cheap on a few fake images.
    settings = dict(benchmark=benchmark, methods=methods_allowed(benchmark), epochs=1, batch_size=32,
                    backbone=backbone, data=data, out=out, ranks=(2,), ks=(2,), ridge_width=64, loggers=())
    return ComparisonConfig(**{**settings, **overrides})


@pytest.mark.parametrize("benchmark", ["split_cifar100", "core50", "domainnet"])
def test_every_allowed_method_runs_to_the_end(benchmark, small_backbone, tmp_path, monkeypatch, one_thread):
    data = fake_data(benchmark, tmp_path / "data", monkeypatch)
    result = run_comparison(config(benchmark, data, small_backbone, tmp_path / "out"), progress=False)
    runs = {run["label"]: run for run in result["runs"]}
    assert list(runs) == list(methods_allowed(benchmark))
    tests = {"split_cifar100": 10, "core50": 1, "domainnet": 6}[benchmark]
    trains = {"split_cifar100": 10, "core50": 8, "domainnet": 6}[benchmark]
    for run in runs.values():
        assert math.isfinite(run["average_accuracy"]) and 0.0 <= run["average_accuracy"] <= 1.0
        assert math.isfinite(run["forgetting"]) and -1.0 <= run["forgetting"] <= 1.0
        rows = 1 if run["method"] in ("Joint-FT", "Joint-LoRA") else trains
        assert len(run["accuracy_matrix"]) == rows and all(len(row) == tests for row in run["accuracy_matrix"])
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [run["label"] for run in saved["runs"]] == list(runs)
    routed = runs["CoLoR"]["routing_accuracy"]
    if benchmark == "core50":  # held-out sessions: no expert is the right one, nothing to report
        assert routed is None and "CoLoR-oracle" not in runs
        assert "| CoLoR | 1 | " in (tmp_path / "out" / "summary.md").read_text()
        matrix = runs["CoLoR"]["accuracy_matrix"]
        assert runs["CoLoR"]["forgetting"] == pytest.approx(matrix[0][0] - matrix[-1][0])
    else:
        assert 0.0 <= routed <= 1.0 and runs["CoLoR-oracle"]["routing_accuracy"] == 1.0


def test_core50_refuses_oracle_routing_before_any_run(tmp_path, capsys):
    from benchmarks.compare.__main__ import main

    with pytest.raises(SystemExit):
        main(["--benchmark", "core50", "--data", str(tmp_path), "--methods", "CoLoR", "CoLoR-oracle"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "methods ['CoLoR-oracle'] cannot run on benchmark 'core50'" in error and "no task label" in error
    assert set(methods_allowed("core50")) == set(METHODS) - {"CoLoR-oracle"}
    assert methods_allowed("domainnet") == METHODS


def test_an_interrupted_core50_comparison_resumes_to_the_uninterrupted_results(small_backbone, tmp_path,
                                                                                monkeypatch, one_thread):
    import benchmarks.compare.run as run_module

    data = fake_data("core50", tmp_path / "data", monkeypatch)
    methods = ("CoLoR", "CoLoR++", "NCM")
    expected = run_comparison(config("core50", data, small_backbone, tmp_path / "whole", methods=methods),
                              progress=False)["runs"]

    build = run_module.build_strategy

    def interrupted(method, *args, **kwargs):  # CoLoR++ stops while training its third session
        strategy = build(method, *args, **kwargs)
        if method == "CoLoR++":
            train, calls = strategy.train, []

            def train_until_interrupted(*train_args, **train_kwargs):
                calls.append(1)
                if len(calls) == 3:
                    raise KeyboardInterrupt
                return train(*train_args, **train_kwargs)
            strategy.train = train_until_interrupted
        return strategy

    out = tmp_path / "interrupted"
    monkeypatch.setattr(run_module, "build_strategy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_comparison(config("core50", data, small_backbone, out, methods=methods), progress=False)
    first = json.loads((out / "runs" / "CoLoR_seed0.json").read_text())
    assert not (out / "results.json").exists() and (out / "checkpoints" / "CoLoR++_seed0.ckpt").exists()

    monkeypatch.setattr(run_module, "build_strategy", build)
    resumed = run_comparison(config("core50", data, small_backbone, out, methods=methods, resume=True),
                             progress=False)["runs"]
    assert resumed[0] == first  # read back, not run again
    for run, whole in zip(resumed, expected):
        assert run["accuracy_matrix"] == whole["accuracy_matrix"]
        assert run["forgetting"] == pytest.approx(whole["forgetting"])
        assert run["average_accuracy"] == pytest.approx(whole["average_accuracy"])
    assert json.loads((out / "results.json").read_text())["runs"] == json.loads(json.dumps(resumed))


@pytest.mark.parametrize("benchmark, lr, epochs, k", [("split_cifar100", 0.01, 50, 20), ("core50", 0.02, 20, 5),
                                                      ("domainnet", 1e-3, 50, 5)])
def test_the_paper_preset_trains_and_feeds_colour_as_its_table_says(benchmark, lr, epochs, k, small_backbone,
                                                                       tmp_path, monkeypatch):
    from benchmarks.backbones import load_backbone
    from benchmarks.compare.methods import Budget, Hyperparameters, build_strategy
    from benchmarks.compare.presets import PAPER_PIPELINE
    from benchmarks.compare.run import build_stream
    from benchmarks.streams.registry import benchmark_spec

    data = fake_data(benchmark, tmp_path / "data", monkeypatch)
    preset = ComparisonConfig.from_preset("paper", benchmark=benchmark, data=data, backbone=small_backbone)
    assert (preset.color_lr, preset.epochs, preset.ks, preset.ranks, preset.batch_size, preset.weight_decay) == (
        lr, epochs, (k,), (64,), 128, 2e-4)
    table = {setting: value for setting, value, _ in PAPER_PIPELINE}
    assert "SGD, momentum 0.9" == table["optimiser"] and "2e-4" == table["weight decay"]
    hp = Hyperparameters(color_lr=preset.color_lr, color_rank=64, color_k=k, weight_decay=preset.weight_decay)
    strategy = build_strategy("CoLoR", lambda classes: load_backbone(small_backbone), 10,
                              Budget(preset.epochs, preset.batch_size), hp)
    options = strategy.config
    assert (options.lr, options.momentum, options.weight_decay, options.rank, options.k) == (lr, 0.9, 2e-4, 64, k)
    assert (strategy.train_mb_size, strategy.train_epochs) == (128, epochs)
    built = []
    spec = dataclasses.replace(benchmark_spec(benchmark), build=lambda *arguments: built.append(arguments))
    build_stream(spec, preset, load_backbone(small_backbone), 0, False)
    assert built[0][:4] == (data, 32, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # ImageNet's, the ViT's size
    build_stream(spec, dataclasses.replace(preset, normalisation="backbone"), load_backbone(small_backbone), 0, False)
    assert built[1][2:4] == ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # timm's cfg of vit_tiny_patch16_224


def test_the_docs_show_the_paper_pipeline_table():
    from benchmarks import REPOSITORY
    from benchmarks.compare.presets import pipeline_table

    assert pipeline_table() in (REPOSITORY / "docs" / "benchmarks" / "runner.md").read_text()
