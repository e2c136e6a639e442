"""The comparison runner on the bundled digits with a tiny checkpointed ViT (seconds on CPU)."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import wandb

from avalanche_color.runner import RunConfig, RunConfigError, run_comparison
from avalanche_color.runner.report import forgetting, weighted_mean
from offline_wandb import exit_code, offline_run_files, offline_wandb, summary  # noqa: F401 (fixture)


def tiny_config(backbone: str, out, **overrides) -> RunConfig:
    settings = dict(benchmark="digits_class", methods=("CoLoR", "CoLoR-oracle", "Naive"), epochs=1,
                    batch_size=64, backbone=backbone, out=out, ranks=(2,))
    settings.update(overrides)
    return RunConfig(**settings)


def test_runner_writes_every_result_and_log(tiny_backbone, tmp_path):
    result = run_comparison(tiny_config(tiny_backbone, tmp_path), progress=False)
    runs = {run["label"]: run for run in result["runs"]}
    assert list(runs) == ["CoLoR", "CoLoR-oracle", "Naive"]
    for run in runs.values():
        matrix = run["accuracy_matrix"]
        assert len(matrix) == 5
        # evaluated on the experiences seen so far: lower triangle filled, upper left empty
        assert all((row[j] is None) == (j > i) for i, row in enumerate(matrix) for j in range(5))
        assert run["forgetting"] == pytest.approx(forgetting(matrix))
        assert 0.0 <= run["average_accuracy"] <= 1.0 and run["wall_seconds"] > 0
    assert runs["CoLoR-oracle"]["routing_accuracy"] == 1.0  # oracle routing reads the task labels
    assert runs["CoLoR-oracle"]["forgetting"] == pytest.approx(0.0)  # its experts never change
    assert runs["Naive"]["routing_accuracy"] is None
    assert runs["CoLoR"]["trainable_parameters_per_experience"] < runs["Naive"]["trainable_parameters_per_experience"]
    # How each method's lr was chosen is recorded beside the value it trained with.
    assert (runs["CoLoR"]["lr"], runs["Naive"]["lr"]) == (0.01, 1e-3)  # a weights file: the pretrained defaults
    assert "--color-lr" in runs["CoLoR"]["lr_chosen_by"] and "--baseline-lr" in runs["Naive"]["lr_chosen_by"]

    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["runs"] == json.loads(json.dumps(result["runs"]))
    assert (tmp_path / "runs.csv").read_text().count("\n") == 1 + 3
    assert (tmp_path / "accuracy_matrices.csv").read_text().count("\n") == 1 + 3 * 15
    assert "| CoLoR-oracle | 1 | " in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "accuracy.png").read_bytes().startswith(b"\x89PNG")
    logs = tmp_path / "logs" / "CoLoR_seed0"
    assert "Top1_Acc_Stream" in (logs / "log.txt").read_text()
    assert (logs / "csv" / "eval_results.csv").read_text().count("\n") > 1
    assert any((logs / "tensorboard").glob("events.out.tfevents.*"))


def test_a_timm_weights_file_runs_at_the_input_size_asked_and_the_results_name_it(tmp_path):
    import hashlib

    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    vit = timm.create_model("test_vit", pretrained=False, num_classes=0)  # 160 px, bicubic, as timm registers it
    path = tmp_path / "weights.safetensors"
    save_file({key: value.contiguous() for key, value in vit.state_dict().items()}, path)
    result = run_comparison(tiny_config(str(path), tmp_path / "out", architecture="test_vit", image_size=16,
                                        methods=("NCM",)), progress=False)
    source = json.loads((tmp_path / "out" / "results.json").read_text())["backbone_source"]
    assert source == result["backbone_source"]
    assert source["spec"] == "weights.safetensors" and source["architecture"] == "test_vit"  # no folder shown
    assert source["input_size"] == [3, 16, 16] and source["interpolation"] == "bicubic"
    assert source["file_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    # Named without its folder, the file is found in AVALANCHE_COLOR_MODELS.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AVALANCHE_COLOR_MODELS", str(tmp_path))
        named = run_comparison(tiny_config("weights.safetensors", tmp_path / "named", architecture="test_vit",
                                           image_size=16, methods=("NCM",)), progress=False)
        assert named["backbone_source"] == source and named["runs"][0]["average_accuracy"] == pytest.approx(
            result["runs"][0]["average_accuracy"])
        with pytest.raises(RunConfigError, match=r"backbone weights file 'other.safetensors' does not exist \(nor in "
                                                 r"AVALANCHE_COLOR_MODELS="):
            run_comparison(tiny_config("other.safetensors", tmp_path / "other", architecture="test_vit"),
                           progress=False)
    with pytest.raises(RunConfigError, match=r"image_size must be a positive multiple of the patch size 16 of "
                                             r"backbone .*weights.safetensors', got 24"):
        run_comparison(tiny_config(str(path), tmp_path / "bad", architecture="test_vit", image_size=24),
                       progress=False)
    assert not (tmp_path / "bad").exists()


def test_rank_ablation_runs_each_variant_and_scales_lora_parameters(tiny_backbone, tmp_path):
    config = tiny_config(tiny_backbone, tmp_path, methods=("CoLoR",), ranks=(1, 2), loggers=())
    runs = run_comparison(config, progress=False)["runs"]
    assert [run["label"] for run in runs] == ["CoLoR r=1 k=4", "CoLoR r=2 k=4"]
    head = 32 * 2 + 2  # the first experience's head: 2 digits
    lora_r1, lora_r2 = (run["trainable_parameters_per_experience"] - head for run in runs)
    assert lora_r2 == 2 * lora_r1 == 2 * 2 * 2 * (32 + 32)  # depth x (q, v) x r x (in + out)


def test_color_family_runs_every_seed_and_baselines_the_first(tiny_backbone, tmp_path):
    config = tiny_config(tiny_backbone, tmp_path, benchmark="digits_domain", methods=("CoLoR", "Naive"),
                         seeds=(0, 1), loggers=())
    runs = run_comparison(config, progress=False)["runs"]
    assert [(run["label"], run["seed"]) for run in runs] == [("CoLoR", 0), ("CoLoR", 1), ("Naive", 0)]
    assert runs[0]["k"] == 5  # the paper's k for domain-incremental streams
    assert "CoLoR | 2 | " in (tmp_path / "summary.md").read_text()


def test_metrics_from_the_accuracy_matrix():
    matrix = [[0.9, None, None], [0.8, 0.6, None], [0.5, 0.4, 0.7]]
    assert forgetting(matrix) == pytest.approx(((0.9 - 0.5) + (0.6 - 0.4)) / 2)
    assert forgetting([[0.3]]) == 0.0
    assert weighted_mean(matrix[-1], [1, 1, 2]) == pytest.approx((0.5 + 0.4 + 2 * 0.7) / 4)


@pytest.mark.parametrize("field, value, message", [
    ("benchmark", "mnist", "benchmark must be one of"),
    ("methods", ("CoLoR", "iCaRL"), "methods must be among"),
    ("ranks", (0,), r"ranks must each be an integer >= 1, got \(0,\)"),
    ("seeds", (), "seeds must not be empty"),
    ("loggers", ("stdout",), "loggers must be among"),
    ("prototypes_per_class", 0, "prototypes_per_class must be an integer >= 1, got 0"),
    ("color_lr", -1.0, "color_lr must be a number > 0"),
    ("seeds", 0, "seeds must be a tuple or list, got 0"),
])
def test_bad_configuration_is_refused(field, value, message, tmp_path):
    with pytest.raises(RunConfigError, match=message) as refused:
        tiny_config("unused", tmp_path, **{field: value})
    assert refused.value.field == field and refused.value.value == value


def test_runner_logs_each_run_to_its_own_offline_wandb_run(tiny_backbone, tmp_path, offline_wandb):
    config = tiny_config(tiny_backbone, tmp_path, methods=("CoLoR", "Naive"), loggers=(),
                         wandb_project="avalanche-color-test")
    runs = run_comparison(config, progress=False)["runs"]
    run_files = offline_run_files(tmp_path / "wandb")
    assert len(run_files) == 2 and wandb.run is None  # one finished W&B run per (method, seed)
    for run, run_file in zip(runs, run_files):
        logged = summary(run_file)
        assert logged["average_accuracy"] == pytest.approx(run["average_accuracy"])
        assert logged["trainable_parameters_per_experience"] == run["trainable_parameters_per_experience"]
        assert exit_code(run_file) == 0
    # Each run's config holds its method's own options, as its strategy got them.
    color, naive = (run_config(run_file) for run_file in run_files)
    assert (color["method"], color["seed"], color["rank"], color["k"], color["lr"], color["routing_features"],
            color["router"]) == ("CoLoR", 0, 2, 4, 0.01, "backbone", "prototypes")
    assert (naive["method"], naive["lr"], naive["momentum"]) == ("Naive", 1e-3, 0.9) and "rank" not in naive
    assert color["comparison"]["benchmark"] == "digits_class"


def run_config(run_file) -> dict:
    """The config a W&B run recorded (its offline file's run and config records)."""
    from offline_wandb import leveldb_records

    values: dict = {}
    for record in leveldb_records(run_file):
        kind = record.WhichOneof("record_type")
        items = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        values.update({item.key: json.loads(item.value_json) for item in items})
    return {key: value.get("value", value) if isinstance(value, dict) and "value" in value else value
            for key, value in values.items() if not key.startswith("_")}


def test_wandb_keeps_each_runs_history_and_summary_out_of_the_terminal(tiny_backbone, tmp_path, offline_wandb,
                                                                        monkeypatch, capfd):
    monkeypatch.delenv("WANDB_SILENT")  # as a user runs it
    config = tiny_config(tiny_backbone, tmp_path, methods=("CoLoR",), loggers=(), wandb_project="avalanche-color-test")
    run_comparison(config, progress=False)
    printed = [line for line in "".join(capfd.readouterr()).splitlines() if line.startswith("wandb:")]
    assert not [line for line in printed if "Run history" in line or "Run summary" in line], printed
    assert len(printed) <= 4, printed  # where the run is saved, and how to view or sync it


@pytest.mark.parametrize("method", ["CoLoR", "CoLoR++", "S-Prompts"])
def test_per_class_prototypes_reach_the_prototype_routed_methods(method, tiny_backbone):
    from avalanche_color.runner.backbone_loading import load_backbone
    from avalanche_color.runner.run import build_method

    def build(**settings):
        config = RunConfig(benchmark="digits_class", epochs=1, **settings)
        return build_method(method, config, lambda classes: load_backbone(tiny_backbone), 10)

    assert build(prototypes_per_class=3).config.prototypes_per_class == 3
    assert build().config.prototypes_per_class is None


def test_the_runner_hides_avalanche_deprecations_about_its_own_code_and_no_other_warning(monkeypatch):
    from avalanche_color.runner.cli import hide_avalanche_deprecations

    shown = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *_, **__: shown.append(str(message)))
    hide_avalanche_deprecations()
    wrapper = warnings.showwarning
    hide_avalanche_deprecations()  # as each main() call does: one wrapper, not a chain
    assert warnings.showwarning is wrapper
    site = os.path.join("site-packages", "avalanche", "training", "plugins", "replay.py")
    warnings.showwarning(DeprecationWarning("Call to deprecated function update"), DeprecationWarning, site, 123)
    warnings.showwarning(DeprecationWarning("ours is old"), DeprecationWarning, "train.py", 1)
    warnings.showwarning(UserWarning("avalanche says"), UserWarning, site, 123)
    assert shown == ["ours is old", "avalanche says"]


@pytest.mark.parametrize("test_experiences", [1, 2, 3])
def test_forgetting_is_avalanches_stream_forgetting_also_for_a_test_stream_unlike_the_training_stream(
        test_experiences):
    """3 training experiences, the whole test stream evaluated after each (CORe50 has 1 test experience)."""
    import torch
    from avalanche.benchmarks import tensors_benchmark
    from avalanche.evaluation.metrics import accuracy_metrics, forgetting_metrics
    from avalanche.training import Naive
    from avalanche.training.plugins import EvaluationPlugin

    from avalanche_color.runner.run import PER_EXPERIENCE, evaluate_whole_stream

    generator = torch.Generator().manual_seed(0)

    def data(n):
        return torch.randn(n, 4, generator=generator), torch.randint(0, 3, (n,), generator=generator)

    benchmark = tensors_benchmark(train_tensors=[data(30) for _ in range(3)],
                                  test_tensors=[data(40) for _ in range(test_experiences)], task_labels=[0, 0, 0],
                                  complete_test_set_only=test_experiences == 1)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), train_epochs=3,
                     criterion=torch.nn.CrossEntropyLoss(),
                     evaluator=EvaluationPlugin(accuracy_metrics(experience=True), forgetting_metrics(stream=True)))
    evaluate = evaluate_whole_stream(benchmark, {})
    matrix = []
    for index, experience in enumerate(benchmark.train_stream):
        strategy.train(experience)
        metrics = evaluate(strategy, index)
        row = {int(PER_EXPERIENCE.match(name)["experience"]): value for name, value in metrics.items()
               if name.startswith("Top1_Acc_Exp")}
        matrix.append([row[j] for j in range(test_experiences)])
    assert len({tuple(row) for row in matrix}) > 1  # accuracies change: the forgetting is not trivially 0
    assert forgetting(matrix) == pytest.approx(metrics["StreamForgetting/eval_phase/test_stream"])


def test_untuned_learning_rates_follow_the_backbone_and_a_flag_or_preset_overrides_them():
    from avalanche_color.runner.backbone_loading import SHIPPED
    from avalanche_color.runner.presets import SHIPPED_BACKBONES, UNTUNED_LRS

    assert set(SHIPPED_BACKBONES) == set(SHIPPED)  # the package's own ViTs, as load_backbone names them
    lrs = lambda config: (config.color_lr, config.baseline_lr)  # noqa: E731
    shipped, pretrained = (tuple(UNTUNED_LRS[kind].values()) for kind in ("shipped", "pretrained"))
    assert shipped == (0.05, 0.01) and pretrained == (0.01, 1e-3)
    assert lrs(RunConfig(benchmark="digits_class")) == shipped  # the benchmark's own backbone, digits
    assert lrs(RunConfig(benchmark="pacs", backbone="offline")) == shipped
    for backbone in ("vit_tiny_patch16_224.augreg_in21k", "weights.safetensors", "random:vit_tiny_patch16_224"):
        assert lrs(RunConfig(benchmark="pacs", backbone=backbone)) == pretrained
    assert lrs(RunConfig(benchmark="pacs", backbone="weights.pt", color_lr=0.2, baseline_lr=0.3)) == (0.2, 0.3)
    paper = RunConfig.from_preset("paper", benchmark="pacs", backbone="weights.pt")
    assert lrs(paper) == (1e-3, 1e-3)  # the preset's CoLoR lr (DomainNet's); the baselines' the backbone's
