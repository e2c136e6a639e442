"""The guide's "Using a trained model" runs as printed: eval mode, route, given experts, save and load."""

from __future__ import annotations

import pytest

from code_blocks import REPOSITORY, run_page, runnable

PAGE = REPOSITORY / "docs" / "guide" / "trained-model.md"


def usage_code() -> str:
    code = [block.code for block in runnable(PAGE)]
    # train, predict, save and load as a folder, load any class's folder, a damaged save refused, the state dict
    assert len(code) == 6
    return "\n".join(code)


@pytest.mark.slow
def test_using_a_trained_model_runs_as_printed():
    run = run_page(PAGE)
    assert run.returncode == 0, run.stderr[-4000:]
    lines = run.stdout.strip().splitlines()
    [experts_line] = [line for line in lines if line.startswith("experts:")]
    [expert_zero_line] = [line for line in lines if line.startswith("expert 0 on all:")]
    experts = eval(experts_line.split("experts:")[1].split("predicted:")[0])
    predicted = eval(experts_line.split("predicted:")[1])
    assert len(experts) == len(predicted) == 8 and set(experts) <= {0, 1}
    assert sum(5 <= p <= 9 for p in predicted) >= 6  # 8 test images of digits 5-9, mostly right
    assert all(0 <= p <= 9 for p in eval(expert_zero_line.split(":")[1]))
    assert "digits_experts does not fit: distance: saved 'euclidean', given 'cosine'" in lines
    saved = run.folder / "digits_experts"
    assert sorted(p.name for p in saved.iterdir()) == ["config.json", "experts.safetensors"]


def test_the_page_shows_eval_mode_before_any_prediction():
    code = usage_code()
    assert code.index("model = strategy.model.eval()") < code.index("model(x)")
