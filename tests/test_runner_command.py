"""The ``avalanche-color compare`` command: flags made from RunConfig, one-line errors, nothing lost on a
bad rerun, and --help before torch is imported."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from avalanche_color.runner import RunConfig, RunConfigError
from avalanche_color.runner.cli import config_from, main, parser, plain_text
from avalanche_color.runner.config import config_record

REPOSITORY = Path(__file__).parents[1]
RESULTS = REPOSITORY / "benchmarks" / "results"
TESTS = REPOSITORY / "tests"


def parsed(*flags: str) -> RunConfig:
    argv = ["compare", *flags]
    return config_from(parser().parse_args(argv), argv)[0]


def test_every_flag_is_a_config_field_with_its_default_and_help():
    fields = [spec for spec in dataclasses.fields(RunConfig) if spec.metadata["cli"]]
    compare = parser()._subparsers._group_actions[0].choices["compare"]  # noqa: SLF001 (argparse has no accessor)
    actions = {action.dest: action for action in compare._actions}  # noqa: SLF001
    for spec in fields:
        assert plain_text(spec.metadata["help"]) in actions[spec.name].help
    defaults = parsed("--benchmark", "digits_class")
    assert defaults == RunConfig(benchmark="digits_class", out=Path("runs") / "digits_class")
    given = parsed("--benchmark", "pacs", "--rank", "1", "2", "--k", "3", "--batch-size", "7", "--loggers",
                   "--resume", "--name", "ablation", "--out-dir", "elsewhere")
    assert (given.ranks, given.ks, given.batch_size, given.loggers, given.resume, given.out) == (
        (1, 2), (3,), 7, (), True, Path("elsewhere") / "ablation")


@pytest.mark.parametrize("folder", sorted(path.parent.name for path in RESULTS.glob("*/results.json")))
def test_each_committed_command_gives_the_config_its_results_record(folder):
    """The committed tables stay reproducible: each recorded command (as the runner reads it now)
    gives every setting its results.json records, the defaults included."""
    results = json.loads((RESULTS / folder / "results.json").read_text())
    recorded = results["config"]
    words = shlex.split(recorded["command"])
    # Every flag after the command's name, in the order it was called (--benchmark need not come first).
    start = next(index for index, word in enumerate(words) if word in ("compare", "benchmarks.compare")) + 1
    flags = [word for word in words[start:] if word != "--publish"]
    config = parsed(*flags)
    # --workers' default depends on the device (0 on the CPU): the results record the number used.
    device = results["device"].split(":")[0]  # the machine the table ran on: "cpu: AMD EPYC ..."
    now = config_record(dataclasses.replace(config, workers=config.loader_workers(device)))
    ignored = {"out", "command", "resume"}  # where it was written and how it was called
    if recorded.get("tune") == "lr":  # every method that reads the untuned lrs took the tuning's choice instead, so
        ignored |= {"color_lr", "baseline_lr"}  # their defaults (since changed: runner/presets.UNTUNED_LRS) made nothing
    differing = {name: (recorded[name], now[name]) for name in recorded
                 if name in now and name not in ignored and recorded[name] != now[name]}
    assert differing == {}


# ---------------------------------------------------------------------- one-line errors


def refused(tmp_path: Path, *flags: str) -> str:
    """The one line a refused command exits with; nothing is written."""
    with pytest.raises(SystemExit) as exit_:
        main(["compare", *flags, "--out-dir", str(tmp_path / "runs")])
    message = str(exit_.value)
    assert "\n" not in message and message.startswith("avalanche-color compare: error: ")
    assert not (tmp_path / "runs").exists()
    return message.removeprefix("avalanche-color compare: error: ")


def test_bad_data_is_refused_in_one_line_naming_the_flag_the_path_and_the_fix(tmp_path):
    missing = tmp_path / "missing.zip"
    assert refused(tmp_path, "--benchmark", "pacs", "--data", str(missing)) == (
        f"--data {missing}: data path {str(missing)!r} does not exist: give the data set's zip file or unpacked "
        "folder")
    (tmp_path / "empty").mkdir()
    assert "is empty" in refused(tmp_path, "--benchmark", "pacs", "--data", str(tmp_path / "empty"))
    corrupt = tmp_path / "pacs.zip"
    corrupt.write_bytes(b"PK\x03\x04 cut short")
    message = refused(tmp_path, "--benchmark", "split_tiny_imagenet", "--data", str(corrupt))
    assert f"{str(corrupt)!r} is not a readable zip file" in message
    assert refused(tmp_path, "--benchmark", "digits_class", "--data", str(corrupt)).startswith(
        f"--data {corrupt}: benchmark 'digits_class' takes no data")


def test_a_k_the_data_cannot_give_and_an_unknown_backbone_are_refused_in_one_line(tmp_path, tiny_backbone):
    message = refused(tmp_path, "--benchmark", "digits_class", "--methods", "CoLoR", "--k", "10000",
                      "--backbone", tiny_backbone)
    assert message.startswith("--k 10000: must be at most ") and "training experience 0 of digits_class" in message
    assert refused(tmp_path, "--benchmark", "digits_class", "--backbone", "no-such-vit").startswith(
        "--backbone no-such-vit: backbone must be a weights file, 'offline', 'digits', a pretrained timm model name")
    assert refused(tmp_path, "--benchmark", "digits_class", "--rank", "0") == "--rank 0: must each be an integer >= 1"


def test_debug_shows_the_error_itself(tmp_path, monkeypatch):
    flags = ["compare", "--benchmark", "digits_class", "--rank", "0", "--out-dir", str(tmp_path)]
    with pytest.raises(RunConfigError, match="ranks must each be an integer >= 1"):
        main([*flags, "--debug"])
    monkeypatch.setenv("AVALANCHE_COLOR_DEBUG", "1")
    with pytest.raises(RunConfigError):
        main(flags)


def command(*arguments: str, env: dict | None = None, cwd: Path = REPOSITORY) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, *arguments], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=environment)


def test_the_command_prints_one_line_and_no_traceback_unless_asked(tmp_path):
    # A setting refused as the config is made, before torch is imported: two quick processes, not two runs' starts.
    flags = ["-m", "avalanche_color.runner", "compare", "--benchmark", "pacs", "--epochs", "0"]
    plain = command(*flags, cwd=tmp_path)
    assert plain.returncode == 1 and plain.stderr.strip().count("\n") == 0 and "Traceback" not in plain.stderr
    debug = command(*flags, env={"AVALANCHE_COLOR_DEBUG": "1"}, cwd=tmp_path)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "RunConfigError" in debug.stderr


def test_help_and_flag_errors_answer_before_torch_is_imported(tmp_path):
    for flags in (["--help"], ["--benchmark", "digits_class", "--epochs", "zero"]):
        run = command("-X", "importtime", "-m", "avalanche_color.runner", "compare", *flags, cwd=tmp_path)
        imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
        assert imported and not {name for name in imported if name.split(".")[0] in ("torch", "avalanche", "timm")}
    assert run.returncode == 2 and "argument --epochs: invalid int value: 'zero'" in run.stderr


def compare_help() -> tuple[str, dict[str, str]]:
    """``compare --help`` as printed, and each flag's help by its setting's name."""
    compare = parser()._subparsers._group_actions[0].choices["compare"]  # noqa: SLF001 (argparse has no accessor)
    return compare.format_help(), {action.dest: action.help for action in compare._actions}  # noqa: SLF001


def test_help_reads_as_plain_text_and_splits_no_flag_or_method_name():
    text, _ = compare_help()
    assert "``" not in text and ":mod:" not in text and ":class:" not in text  # the runner's docstring, unmarked
    assert "(python -m avalanche_color.runner compare ... is the same command.)" in text
    assert re.search(r"[\w-]-\n", text) is None  # no line ends inside --baseline-seeds or CoLoR-gaussian


def test_each_flag_some_methods_take_lists_them_from_the_registry():
    from avalanche_color.runner.methods import METHODS, REGISTRY, MethodRun, methods_taking, settings_read

    _, helps = compare_help()
    per_method = {spec.name for spec in dataclasses.fields(RunConfig) if spec.metadata["per_method"]}
    for name in per_method:
        taken = methods_taking(name)
        assert 0 < len(taken) < len(METHODS), name
        assert helps[name].endswith("; taken by " + ", ".join(taken))
    # Every setting a method's options read is listed (the preset names settings for every method alike).
    read = set().union(*(settings_read(name) for name in METHODS))
    assert read - {"preset", "preset_settings"} <= per_method
    # --precision: the methods whose strategy is built with it, on a real config, among them the LoRA peers.
    config = RunConfig(benchmark="digits_class", precision="bf16-mixed")
    run = MethodRun(config, rank=2, k=2, num_classes=10, backbone=None, strategy_options={}, num_experiences=5)
    built_with = tuple(name for name, entry in REGISTRY.items() if entry.options(run).get("precision") == "bf16-mixed")
    assert methods_taking("precision") == built_with
    assert {"LoRA-Sub", "CL-LoRA", "SD-LoRA", "InfLoRA", "L2P", "CoLoR", "Joint-LoRA"} <= set(built_with)
    assert "Naive" not in built_with


# ---------------------------------------------------------------------- nothing lost on a bad rerun


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_bad_or_failed_rerun_leaves_the_finished_comparison_as_it_was(tiny_backbone, tmp_path, monkeypatch):
    from avalanche_color.runner.methods import REGISTRY

    flags = ["compare", "--benchmark", "digits_class", "--methods", "CoLoR", "Naive", "--epochs", "1", "--rank", "2",
             "--backbone", tiny_backbone, "--loggers", "text", "--out-dir", str(tmp_path), "--name", "run"]
    main(flags)
    folder = tmp_path / "run"
    finished = snapshot(folder)
    assert {"results.json", "summary.md", "runs/CoLoR_seed0.json", "checkpoints/CoLoR_seed0.ckpt"} <= set(finished)

    with pytest.raises(SystemExit, match="--k 10000: must be at most"):
        main([*flags, "--k", "10000"])
    assert snapshot(folder) == finished  # refused before anything changed

    def fails(*args, **kwargs):
        raise RuntimeError("the second method fails")

    monkeypatch.setitem(REGISTRY, "Naive", dataclasses.replace(REGISTRY["Naive"], build=fails))
    with pytest.raises(SystemExit, match="RuntimeError: the second method fails"):
        main([*flags, "--epochs", "2"])
    assert {name: data for name, data in snapshot(folder).items() if not name.startswith("attempt/")} == finished
    assert (folder / "attempt" / "runs" / "CoLoR_seed0.json").exists()  # the new attempt waits for --resume

    with pytest.raises(SystemExit) as exit_:  # resuming it with other settings: says what to do
        main([*flags, "--epochs", "3", "--resume"])
    assert str(exit_.value).startswith("avalanche-color compare: error: --resume: cannot continue the runs in ")
    assert "other settings: epochs 2 (now 3); run without --resume" in str(exit_.value) and "another --name" in str(exit_.value)


# ---------------------------------------------------------------------- the registry of methods


def test_a_registered_method_is_in_the_runner_and_the_shared_tests(tiny_backbone, tmp_path):
    """A method joins in one place: ``register`` (or an entry in runner/methods.py). The toy's strategy is
    NCM under another class name, so it must give NCM's numbers."""
    from toy_method import TOY

    from avalanche_color.runner.methods import REGISTRY, methods_taking, register
    from benchmarks.reporting.readme import render_methods

    register(TOY)
    try:
        assert "Toy" in compare_help()[1]["methods"] and "Toy" in methods_taking("baseline_seeds")
        assert "| Toy | `toy_method:ToyNCM` | NCM under another name |" in render_methods()  # the docs' table
        main(["compare", "--benchmark", "digits_class", "--methods", "NCM", "Toy", "--backbone", tiny_backbone,
              "--loggers", "--quiet", "--out-dir", str(tmp_path), "--name", "toy"])
        ncm, toy = json.loads((tmp_path / "toy" / "results.json").read_text())["runs"]
        assert (ncm["label"], toy["label"]) == ("NCM", "Toy") and toy["accuracy_matrix"] == ncm["accuracy_matrix"]
        with pytest.raises(ValueError, match="method 'Toy' is registered already"):
            register(TOY)
    finally:
        del REGISTRY["Toy"]
    with pytest.raises(SystemExit):  # gone again
        parsed("--benchmark", "digits_class", "--methods", "Toy")
    # The tests shared by every strategy, collected with the toy registered (as a pytest plugin), include it.
    collected = command("-m", "pytest", "--collect-only", "-q", "-p", "toy_method", "-p", "no:cacheprovider",
                        "tests/test_what_a_user_meets.py", env={"PYTHONPATH": f"{REPOSITORY}{os.pathsep}{TESTS}"})
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert "test_every_strategy_refuses_an_unusable_device_naming_it[Toy-tpu]" in collected.stdout


def test_the_registry_lists_the_methods_without_importing_torch():
    run = command("-c", "import sys; from avalanche_color.runner.methods import REGISTRY; "
                        "print(len(REGISTRY), 'torch' in sys.modules)")
    registered, torch_imported = run.stdout.split()
    assert int(registered) >= 21 and torch_imported == "False"  # CoLoR's 7, 2 prompt, 4 LoRA peers, 6 + 2 baselines


def test_the_committed_results_command_form_is_the_runners_command():
    from benchmarks.compare.__main__ import translated

    results = os.path.relpath(RESULTS)
    assert translated(["--benchmark", "pacs", "--publish", "--epochs", "3"]) == [
        "compare", "--benchmark", "pacs", "--epochs", "3", "--out-dir", results]
    argv = translated(["--benchmark", "digits_class", "--publish"])
    assert config_from(parser().parse_args(argv), argv)[0].out == Path(results) / "digits_class"


def test_sd_lora_takes_its_codes_lr_on_every_budget_and_inf_lora_under_the_paper_preset():
    from avalanche_color import InfLoRAConfig, SDLoRAConfig
    from avalanche_color.runner.config import RunConfig
    from avalanche_color.runner.methods import MethodRun, method

    def options(name, **settings):
        run = MethodRun(RunConfig(benchmark="split_cifar100", **settings), 64, None, 100, lambda classes: None, {},
                        num_experiences=10)
        return method(name).options(run)

    assert "lr" not in options("SD-LoRA") and "lr" not in options("SD-LoRA", preset="paper")
    assert options("InfLoRA")["lr"] == 5e-3
    assert SDLoRAConfig().lr == 0.008 and InfLoRAConfig().lr == 5e-4  # what the strategies then use
    assert "lr" not in options("InfLoRA", preset="paper") and options("InfLoRA")["num_experiences"] == 10
    # Under the preset the peers keep their code's weight decay, unless the flag asks for another value.
    paper = dict(preset="paper", weight_decay=2e-4)
    assert all("weight_decay" not in options(name, **paper) for name in ("SD-LoRA", "InfLoRA", "CL-LoRA"))
    assert options("CL-LoRA", preset="paper", weight_decay=0.0)["weight_decay"] == 0.0
    assert options("CL-LoRA", weight_decay=2e-4)["weight_decay"] == 2e-4
    assert all(method(name).lr_chosen_by for name in ("SD-LoRA", "InfLoRA", "CoLoR", "S-Prompts", "L2P", "EWC"))
    assert not method("NCM").lr_chosen_by  # nothing trains by gradient
