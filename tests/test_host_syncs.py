"""Host syncs counted on CPU: what a training step and an evaluation batch read from device tensors.

Each call of ``Tensor.item``, ``__bool__``, ``__int__``, ``__float__``, ``__index__`` or ``tolist`` made while a
training iteration or an evaluation batch runs is counted by ``benchmarks.gpu_checklist.host_reads`` (on a GPU
each one waits for the device to drain).
Not counted: data loading (host tensors of the dataset and the loader) and ``torch.optim`` (Adam's step
counters are host tensors on a GPU too). On a GPU, ``benchmarks.gpu_checklist`` counts the real syncs
with ``torch.cuda.set_sync_debug_mode``.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from avalanche.core import SupervisedPlugin
from avalanche.training.plugins import EvaluationPlugin

from avalanche_color import CoLoR
from avalanche_color.evaluation.metrics import routing_accuracy_metrics
from avalanche_color.runner.methods import REGISTRY
from avalanche_color.training.data_checks import DataChecksPlugin, DeferredLossCheck
from benchmarks.gpu_checklist.host_reads import HostReads, counting
from registered import build_small_with, one_method_per_strategy
from streams import class_stream, domain_stream, tiny_vit

TRAINING_BUDGET = 1  # per training step
# Per evaluation batch, whatever the batch size and the number of experts: the images' finiteness check,
# the mixed-expert prediction's read (experts/routed_vit.py), and, on the first batch after an experience
# only, the experts' experiences read once for the routing accuracy (kept until an expert is added).
EVAL_BUDGET = 3
# With cache_evaluation, two more: the routed experts, read once per batch to look rows up, and, on the
# first batch after an experience only, the experts' finished flags. (On a GPU the images' keys are one more.)
CACHED_EVAL_BUDGET = 5


def evaluator() -> EvaluationPlugin:
    # Avalanche's own accuracy and loss metrics read each batch on the host: not the package's to change.
    return EvaluationPlugin(*routing_accuracy_metrics(), loggers=[])


# Every strategy of the runner's registry, one method per class (registered.py), built as the runner builds it (CoLoR
# and S-Prompts with their evaluation cache); and two of CoLoR's own parts, which read tensors of their own: its
# Gaussian router, and its evaluation without the cache (a strategy's default).
CASES = {**{name: (name, {}) for name in one_method_per_strategy()},
         "CoLoR-gaussian": ("CoLoR-gaussian", {}), "CoLoR-uncached": ("CoLoR", {"cache_evaluation": False})}
TRAINED_BY_GRADIENT = [case for case, (name, _) in CASES.items() if REGISTRY[name].lr_chosen_by]  # not NCM, RanPAC


def count(case: str, experiences: int = 2, eval_mb_size: int = 16, loss_check_every=None) -> tuple[HostReads, int]:
    """The host reads of ``case`` trained on ``experiences`` and evaluated twice, and its evaluation budget."""
    counter = HostReads()
    name, options = CASES[case]
    strategy = build_small_with(name, options=options, plugins=[counter], evaluator=evaluator(),
                                eval_mb_size=eval_mb_size, epochs=1, batch_size=16)
    if loss_check_every is not None:
        [checks] = [plugin for plugin in strategy.plugins if isinstance(plugin, DataChecksPlugin)]
        checks.loss_check_every = loss_check_every
    benchmark = class_stream(experiences)
    with counting(counter):
        if REGISTRY[name].joint:  # trained once, on the whole stream
            strategy.train(benchmark.train_stream)
        else:
            for experience in benchmark.train_stream:
                strategy.train(experience)
        strategy.eval(benchmark.test_stream)
        strategy.eval(benchmark.test_stream)  # with the cache: its second pass finds every row
    cached = getattr(strategy.model, "eval_cache", None) is not None
    return counter, CACHED_EVAL_BUDGET if cached else EVAL_BUDGET


def most(windows: list[Counter]) -> int:
    return max((sum(window.values()) for window in windows), default=0)


@pytest.mark.parametrize("name", CASES)
def test_a_training_step_and_an_evaluation_batch_stay_within_their_sync_budgets(name, one_thread):
    counter, budget = count(name)
    training, evaluation = counter.per("train"), counter.per("eval")
    assert evaluation and bool(training) == (name in TRAINED_BY_GRADIENT)  # the others take no training step
    # On the CPU the loss is read every step (the one sync of a step); nothing else is.
    assert most(training) <= TRAINING_BUDGET, [dict(w) for w in training if sum(w.values()) > TRAINING_BUDGET][:2]
    assert most(evaluation) <= budget, [dict(w) for w in evaluation if sum(w.values()) > budget][:2]


# CoLoR's Gaussian router and uncached evaluation train as CoLoR does: one method per strategy class.
@pytest.mark.parametrize("name", [name for name in one_method_per_strategy() if name in TRAINED_BY_GRADIENT])
def test_with_the_loss_read_every_n_steps_as_on_a_gpu_a_step_reads_nothing(name, one_thread):
    counter, _ = count(name, loss_check_every=50)
    assert most(counter.per("train")) == 0  # the loss is read at each epoch's end, outside any step


def test_the_evaluation_count_does_not_grow_with_experts_or_batch_size(one_thread):
    # CoLoR's own detail: its routed experts, one more per experience, mixed in an evaluation batch.
    for case in ("CoLoR-uncached", "CoLoR"):
        counts = {(experiences, batch): most(count(case, experiences, batch)[0].per("eval"))
                  for experiences in (1, 3) for batch in (8, 32)}
        assert len(set(counts.values())) == 1, (case, counts)


# ---------------------------------------------------------------------- the deferred loss check


def test_a_deferred_loss_check_names_the_first_bad_step_and_keeps_nan_out_of_the_weights(one_thread):
    # The data checks plugin's deferral, alike in every strategy (test_data_checks_all.py stops each of them at a NaN
    # loss): shown on CoLoR.
    strategy = CoLoR(tiny_vit(0), rank=2, k=3, lr=0.05, train_epochs=1, train_mb_size=8, evaluator=evaluator())
    [checks] = [plugin for plugin in strategy.plugins if isinstance(plugin, DataChecksPlugin)]
    checks.loss_check_every = 4

    class PoisonFrom(SupervisedPlugin):
        def __init__(self, iteration: int) -> None:
            super().__init__()
            self.iteration = iteration

        def after_forward(self, strategy, **kwargs) -> None:
            if strategy.clock.train_epoch_iterations >= self.iteration:
                strategy.mb_output = strategy.mb_output * float("nan")

    strategy.plugins.insert(0, PoisonFrom(iteration=1))
    with pytest.raises(FloatingPointError, match=r"non-finite at experience 0, epoch 0, iteration 1; read 2 steps "
                                                 r"later"):
        strategy.train(domain_stream(1).train_stream[0])
    trained = [p for group in strategy.optimizer.param_groups for p in group["params"]]
    assert all(bool(torch.isfinite(p).all()) for p in trained)


def test_the_deferred_check_reads_once_per_interval_and_at_the_end():
    check = DeferredLossCheck(3)
    with counting(HostReads()) as counter:
        counter.open("check")
        for step in range(3):
            check.add(torch.tensor(1.0), f"step {step}")
            if check.due:
                check.check()
        counter.close()
        reads = counter.per("check")[0]
    assert sum(reads.values()) == 1
    check.add(torch.tensor(float("inf")), "step 3")
    with pytest.raises(FloatingPointError, match="non-finite at step 3; read 0 steps later"):
        check.check()
    with pytest.raises(ValueError, match="every must be an integer >= 1, got 0"):
        DeferredLossCheck(0)


def test_the_counter_sees_copies_nonzero_and_boolean_masks_but_not_plain_indexing():
    reads = HostReads()
    x = torch.arange(-3.0, 3.0)
    with counting(reads):
        reads.open("probe")
        x[x > 0], x.nonzero(), torch.nonzero(x), x.cpu(), x[1:3], x[torch.tensor([0, 2])]
        y = x.clone()
        y[y < 0] = 0.0
        reads.close()
    assert sorted(what for what, _ in reads.per("probe")[0].elements()) == [
        "boolean mask (getitem)", "boolean mask (setitem)", "cpu", "nonzero", "torch.nonzero"]
    assert "counted" not in torch.nonzero.__name__  # restored


@pytest.mark.parametrize("num_samples, batch_size, world", [(10, 4, 2), (7, 3, 3), (100, 16, 4), (5, 100, 2)])
def test_every_rank_knows_each_evaluation_batchs_row_counts_without_reading_them(num_samples, batch_size, world):
    """Under torchrun an evaluation batch is gathered with every rank's row count from eval_row_counts, which each
    rank computes alike on the host (no device read per batch): the counts are the batches each rank's loader
    makes, batch by batch, and those batches hold every sample once, none empty."""
    from avalanche_color.training.distributed import eval_batches, eval_row_counts

    counts = eval_row_counts(num_samples, batch_size, world)
    batches = [eval_batches(num_samples, batch_size, rank, world) for rank in range(world)]
    assert all(len(rank_batches) == len(counts) for rank_batches in batches)  # the gathers of all ranks in step
    for rank, rank_batches in enumerate(batches):
        assert [sizes[rank] for sizes in counts] == [len(batch) for batch in rank_batches]
    assert sorted(index for rank_batches in batches for batch in rank_batches for index in batch) == list(
        range(num_samples))
    assert min(min(sizes) for sizes in counts) >= 1
