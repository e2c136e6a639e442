"""benchmarks.perf.strategies: the perf rows time the strategies' own train and eval calls. Stepped training is
the same training, one iteration per step, nothing running between steps; an evaluation between steps leaves it
so; the clock counts what the strategy ran (tiny ViTs, CPU, seconds)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.perf.strategies import (Clock, TrainingTurns, evaluation_variant, grown, strategies, synthetic_stream,
                                        training_variant)
from benchmarks.perf.timing import interleaved
from streams import IMAGE_SIZE, tiny_vit

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore::avalanche_color.ExpertLearnedNothing"),
              pytest.mark.filterwarnings("ignore:No loggers specified")]
CPU = torch.device("cpu")
CLASSES, BATCH, K = 2, 4, 3
EXPERIENCES, STEPS = 3, 3  # the last experience: one untimed iteration, then STEPS


def stream():
    return synthetic_stream(EXPERIENCES, CLASSES, (IMAGE_SIZE, IMAGE_SIZE), [K + 1] * (EXPERIENCES - 1)
                            + [(1 + STEPS) * BATCH], BATCH)


def built(name: str, clock: Clock):
    return strategies(tiny_vit, 2, K, BATCH, CPU, "32-true", EXPERIENCES * CLASSES, lambda _: [clock])[name]()


def trainable_state(strategy) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in strategy.model.named_parameters() if v.requires_grad}


@pytest.mark.parametrize("name", ["CoLoR", "CL-LoRA", "full fine-tuning"])
def test_stepped_training_with_evaluations_between_steps_ends_where_one_train_call_ends(name):
    data = stream()
    last, test = data.train_stream[EXPERIENCES - 1], data.test_stream[EXPERIENCES - 1]
    torch.manual_seed(1)
    plain = built(name, Clock(CPU))
    if name != "full fine-tuning":
        grown(plain, data)
    torch.manual_seed(2)
    plain.train(last)

    clock = Clock(CPU)
    torch.manual_seed(1)
    stepped = built(name, clock)
    if name != "full fine-tuning":
        grown(stepped, data)
    before = len(clock.training)
    torch.manual_seed(2)  # the loader's shuffle, drawn when the train call starts
    turns = TrainingTurns(stepped, last, clock).start()
    assert len(clock.training) == before + 1  # start: the adaptation and one iteration
    for step in range(STEPS):
        state = trainable_state(stepped)
        stepped.eval([test])  # what Avalanche's periodic evaluation does between iterations
        assert all(torch.equal(v, state[k]) for k, v in trainable_state(stepped).items())  # nothing ran meanwhile
        seconds = turns.step()
        assert len(clock.training) == before + 2 + step and seconds == clock.training[-1] > 0
        assert any(not torch.equal(v, state[k]) for k, v in trainable_state(stepped).items())  # it trained
    with pytest.raises(RuntimeError, match="no batch left"):
        turns.step()
    turns.close()
    assert len(clock.evaluation) == STEPS  # one batch: one iteration per eval call
    ends = plain.model.state_dict(), stepped.model.state_dict()
    assert ends[0].keys() == ends[1].keys()
    for key, value in ends[0].items():
        assert torch.allclose(value.float(), ends[1][key].float(), atol=1e-6), key


def test_rounds_interleave_stepped_strategies_with_evaluations_and_take_the_clock_s_seconds():
    data, clocks, turns, variants = stream(), {}, {}, {}
    for name in ("CoLoR", "SD-LoRA"):
        clocks[name] = Clock(CPU)
        strategy = grown(built(name, clocks[name]), data)
        turns[name] = TrainingTurns(strategy, data.train_stream[EXPERIENCES - 1], clocks[name]).start()
        variants[f"{name} training"] = training_variant(turns[name])
        variants[f"{name} eval"] = evaluation_variant(strategy, data.test_stream[EXPERIENCES - 1], clocks[name])
    rounds = interleaved(variants, STEPS - 1, CPU, log=False)  # a warm-up round, then STEPS - 1
    for training in turns.values():
        training.close()
    assert len(rounds) == STEPS - 1
    for name, clock in clocks.items():
        assert [r[f"{name} training"] for r in rounds] == clock.training[-(STEPS - 1):]
        assert [r[f"{name} eval"] for r in rounds] == clock.evaluation[-(STEPS - 1):]


def test_a_failing_training_call_is_raised_in_the_caller_s_thread_not_left_waiting():
    data, clock = stream(), Clock(CPU)
    strategy = built("CoLoR", clock)

    def broken(**kwargs):
        raise ValueError("broken forward")

    strategy.forward = broken
    with pytest.raises(RuntimeError, match="CoLoR's training failed") as raised:
        TrainingTurns(strategy, data.train_stream[0], clock).start()
    assert isinstance(raised.value.__cause__, ValueError)


def test_cl_lora_s_evaluation_between_steps_runs_its_task_specific_blocks_once_per_finished_experience():
    # The table's CL-LoRA ideal (its shared half once, its task-specific half once per finished experience).
    data, clock = stream(), Clock(CPU)
    strategy = grown(built("CL-LoRA", clock), data)
    turns = TrainingTurns(strategy, data.train_stream[EXPERIENCES - 1], clock).start()
    model, runs = strategy.model, []
    shared, specific = model.blocks[0], model.blocks[model.num_shared]
    assert model.num_shared == 1 and len(model.blocks) == 2
    shared.attn.qkv.register_forward_hook(lambda *_: runs.append("shared"))
    specific.attn.qkv.register_forward_hook(lambda *_: runs.append("specific"))
    strategy.eval([data.test_stream[EXPERIENCES - 1]])
    evaluated = list(runs)
    turns.close()
    assert evaluated.count("shared") == 1 and evaluated.count("specific") == EXPERIENCES - 1
