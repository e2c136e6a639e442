"""Issue 39, point 4: a resume under other options is refused, naming each; allow_changed continues anyway."""

from __future__ import annotations

import pytest
import torch

from avalanche_color import CheckpointError, train_stream
from helpers import tiny_color
from streams import class_stream

pytestmark = pytest.mark.usefixtures("one_thread")

RUN = dict(train_epochs=2, k=2, lr=0.05)


def finished_checkpoint(path):
    benchmark = class_stream(num_experiences=2, per_class=6)
    records = train_stream(tiny_color(**RUN), benchmark, checkpoint=path)
    return benchmark, records


@pytest.mark.parametrize("change, message", [
    (dict(k=3), r"k: checkpoint 2, strategy 3"),
    (dict(lr=0.01), r"lr: checkpoint 0\.05, strategy 0\.01"),
    (dict(train_epochs=3), r"train_epochs: checkpoint 2, strategy 3"),
    (dict(k=3, lr=0.01), r"k: checkpoint 2, strategy 3; lr: checkpoint 0\.05, strategy 0\.01\. .*"
                         r"allow_changed=\['k', 'lr'\]"),
])
def test_a_resume_under_other_options_is_refused_naming_each(tmp_path, change, message):
    path = tmp_path / "run.ckpt"
    benchmark, _ = finished_checkpoint(path)
    strategy = tiny_color(**{**RUN, **change})
    before = {k: v.clone() for k, v in strategy.model.state_dict().items()}
    with pytest.raises(CheckpointError, match=rf"checkpoint {path} was written by a run with other options: {message}"):
        train_stream(strategy, benchmark, checkpoint=path)
    after = strategy.model.state_dict()
    assert strategy.model.num_experts == 0 and all(torch.equal(after[k], before[k]) for k in before)


def test_options_that_do_not_change_the_run_may_differ(tmp_path):
    path = tmp_path / "run.ckpt"
    benchmark, records = finished_checkpoint(path)
    assert train_stream(tiny_color(**RUN, eval_mb_size=7, num_workers=0), benchmark, checkpoint=path) == records


def test_allow_changed_continues_with_the_new_values(tmp_path):
    path = tmp_path / "run.ckpt"
    benchmark, records = finished_checkpoint(path)
    resumed = train_stream(tiny_color(**{**RUN, "train_epochs": 3}), benchmark, checkpoint=path,
                           allow_changed=["train_epochs"])
    assert resumed == records  # the finished run's experiences are not trained again
    with pytest.raises(ValueError, match=r"allow_changed names options this strategy does not have: \['epochs'\]"):
        train_stream(tiny_color(**RUN), benchmark, checkpoint=path, allow_changed=["epochs"])


def test_an_option_added_after_the_checkpoint_was_written_resumes_at_its_default_only(tmp_path):
    from avalanche_color import read_checkpoint
    from avalanche_color.training.resume import write_checkpoint

    path = tmp_path / "run.ckpt"
    benchmark, records = finished_checkpoint(path)
    older = read_checkpoint(path)  # as a checkpoint written before top_m and warm_start existed
    older.options = {name: value for name, value in older.options.items() if name not in ("top_m", "warm_start")}
    write_checkpoint(path, older)
    assert train_stream(tiny_color(**RUN), benchmark, checkpoint=path) == records
    with pytest.raises(CheckpointError, match=r"other options: top_m: checkpoint 1, strategy 2\. "):
        train_stream(tiny_color(**RUN, top_m=2), benchmark, checkpoint=path)
