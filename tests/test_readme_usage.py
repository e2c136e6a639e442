"""The README's "Using a trained model" runs as printed: eval mode, route, given experts, save and load."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


def usage_code() -> str:
    section = README.read_text().split("\n## Using a trained model\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 3
    return "\n".join(blocks)


@pytest.mark.slow
def test_using_a_trained_model_runs_as_printed(tmp_path):
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", usage_code()], cwd=tmp_path, env=environment,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    experts_line, expert_zero_line, refusal = run.stdout.strip().splitlines()[-3:]
    experts = eval(experts_line.split("experts:")[1].split("predicted:")[0])
    predicted = eval(experts_line.split("predicted:")[1])
    assert len(experts) == len(predicted) == 8 and set(experts) <= {0, 1}
    assert all(0 <= p <= 9 for p in eval(expert_zero_line.split(":")[1]))
    assert refusal == "digits_experts does not fit: distance: saved 'euclidean', given 'cosine'"
    assert sorted(p.name for p in (tmp_path / "digits_experts").iterdir()) == ["config.json", "experts.safetensors"]


def test_the_readme_shows_eval_mode_before_any_prediction():
    code = usage_code()
    assert code.index("model = strategy.model.eval()") < code.index("model(x)")
