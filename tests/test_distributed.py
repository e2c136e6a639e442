"""CoLoR under torchrun: 2 CPU processes (gloo) against a single-process run on the same data; the same on
2 GPUs with NCCL where there are (marked ``cuda``); the tensor collectives; each rank's device."""

import json
from pathlib import Path

import pytest
import torch

from avalanche_color.training.distributed import eval_batches, shard
from helpers import UNSATURATED, once_per_session, run_torchrun, stream_metric, tiny_color, train_all
from streams import class_stream

PER_RANK_BATCH = 8
ROUTER_WIDTH = 128


def launch_two_ranks(out: Path, cases: tuple[str, ...], backend: str = "gloo", runner: tuple[str, ...] = ()) -> str:
    """One torchrun launch of 2 ranks (``backend``: gloo on CPU, or nccl on 2 GPUs) that run ``cases`` in turn
    (distributed_run.py): ``prototypes`` and ``ridge`` train and evaluate tiny CoLoR with that router on
    class_stream, ``collectives`` runs the tensor collectives; each into ``out / case``. Then, with ``runner``
    (its arguments), ``python -m avalanche_color.runner`` on the 2 ranks. Returns the ranks' standard output."""
    then_runner = ("--", *runner) if runner else ()
    return run_torchrun("distributed_run.py", str(out), str(PER_RANK_BATCH), str(ROUTER_WIDTH), *cases, *then_runner,
                        AVALANCHE_COLOR_TEST_BACKEND=backend)


def runner_arguments(backbone: str, out: Path) -> tuple[str, ...]:
    """The comparison runner's command line on 2 ranks: --batch-size is per process, 2 x 32 is the
    single-process run's 64."""
    return ("compare", "--benchmark", "digits_class", "--methods", "CoLoR", "--epochs", "1", "--batch-size", "32",
            "--backbone", backbone, "--rank", "2", "--color-lr", "0.05", "--name", str(out))


def ranks_of(out: Path, case: str) -> list[dict]:
    """What each of the 2 ranks ended ``case`` with."""
    return [torch.load(out / case / f"rank{rank}.pt") for rank in range(2)]


def run_in_one_process(**options) -> tuple:
    """The same run in one process, with the 2 ranks' combined batch size."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        strategy = tiny_color(train_mb_size=2 * PER_RANK_BATCH, **UNSATURATED, **options)
        results = train_all(strategy, class_stream())
    finally:
        torch.set_num_threads(threads)
    return strategy, results


@pytest.fixture(scope="module")
def gloo_launch(tmp_path_factory, tiny_backbone) -> Path:
    """The folder of the one gloo launch that runs every case, then the comparison runner into ``runner``
    (starting 2 processes costs more than a case): once per test session, by the first test to ask (under
    pytest-xdist the workers share it through a lock in the session's temporary folder). The ranks' standard
    output: ``stdout.txt``."""
    def launch(out: Path) -> None:
        stdout = launch_two_ranks(out, ("collectives", "prototypes", "ridge"),
                                  runner=runner_arguments(tiny_backbone, out / "runner"))
        (out / "stdout.txt").write_text(stdout)

    return once_per_session(tmp_path_factory, "distributed_torchrun", launch)


@pytest.fixture(scope="module")
def two_ranks(gloo_launch) -> list[dict]:
    return ranks_of(gloo_launch, "prototypes")


@pytest.fixture(scope="module")
def one_process() -> tuple:
    return run_in_one_process()


def test_class_router_statistics_come_from_every_rank_and_equal_a_single_process_run(gloo_launch):
    first, second = ranks_of(gloo_launch, "ridge")
    single = run_in_one_process(router="ridge", router_width=ROUTER_WIDTH)[0].model.router.state_dict()
    assert first["class_router"].keys() == single.keys()
    for key, value in single.items():
        assert torch.equal(first["class_router"][key], second["class_router"][key]), key
        # Backbone features: sharding must not change them (float sums in another order: close).
        torch.testing.assert_close(first["class_router"][key].to(value.dtype), value, rtol=1e-4, atol=1e-3, msg=key)


def test_both_ranks_hold_identical_prototypes_equal_to_a_single_process_run(two_ranks, one_process):
    first, second = two_ranks
    assert first["world_size"] == second["world_size"] == 2
    assert torch.equal(first["prototypes"], second["prototypes"])
    assert torch.equal(first["owners"], second["owners"])
    # Backbone routing: the prototypes come from the frozen ViT, so sharding must not change them.
    router = one_process[0].model.router
    assert torch.equal(first["owners"], router.owners)
    torch.testing.assert_close(first["prototypes"], router.prototypes, atol=1e-5, rtol=1e-5)


def test_final_accuracy_matches_a_single_process_run(two_ranks, one_process):
    single = stream_metric(one_process[1], "Top1_Acc")
    assert 0.4 < single < 0.9  # neither saturated nor chance (0.25): the comparison can fail
    for rank in two_ranks:
        assert rank["accuracy"] == two_ranks[0]["accuracy"]  # reduced: the same on every rank
        assert abs(rank["accuracy"] - single) <= 0.05, (rank["accuracy"], single)
        assert rank["routing_accuracy"] == pytest.approx(stream_metric(one_process[1], "RoutingAcc"), abs=1e-6)


def test_metrics_count_every_test_sample_exactly_once(two_ranks):
    test_stream = class_stream().test_stream
    for rank in two_ranks:
        assert sorted(rank["seen_labels"]) == list(range(len(test_stream)))
        for experience in test_stream:
            expected = torch.as_tensor(experience.dataset.targets)
            # Contiguous shards gathered in rank order: the whole experience, in order, once.
            assert torch.equal(rank["seen_labels"][experience.current_experience], expected)


@pytest.mark.parametrize("num_samples, batch_size, world_size", [(40, 64, 2), (129, 64, 2), (130, 64, 4), (7, 2, 3)])
def test_evaluation_shards_cover_every_sample_once_in_equal_batch_counts(num_samples, batch_size, world_size):
    per_rank = [eval_batches(num_samples, batch_size, rank, world_size) for rank in range(world_size)]
    assert len({len(batches) for batches in per_rank}) == 1
    assert all(batch for batches in per_rank for batch in batches)
    assert [i for batches in per_rank for batch in batches for i in batch] == list(range(num_samples))
    assert [len(shard(num_samples, r, world_size)) for r in range(world_size)] == [
        len([i for b in per_rank[r] for i in b]) for r in range(world_size)]


def test_evaluation_refuses_fewer_samples_than_ranks():
    with pytest.raises(ValueError, match="at least one sample per rank"):
        eval_batches(1, 64, 0, 2)


def test_comparison_runner_under_torchrun_matches_a_single_process_run(gloo_launch, tiny_backbone, tmp_path,
                                                                      one_thread):
    from avalanche_color.runner import RunConfig, run_comparison

    # python -m avalanche_color.runner compare ... on the launch's 2 ranks, after its cases (runner_arguments).
    out = gloo_launch / "runner"
    assert (gloo_launch / "stdout.txt").read_text().count("written to") == 1  # rank 0 alone reports
    saved = json.loads((out / "results.json").read_text())
    assert saved["world_size"] == 2 and [r["label"] for r in saved["runs"]] == ["CoLoR"]
    # One record and one provenance stamp, both from rank 0.
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["CoLoR_seed0.json", "provenance.json"]
    assert (out / "logs" / "CoLoR_seed0" / "log.txt").exists()

    single = run_comparison(RunConfig(benchmark="digits_class", methods=("CoLoR",), epochs=1, batch_size=64,
                                      backbone=tiny_backbone, out=tmp_path / "one", ranks=(2,), loggers=(),
                                      color_lr=0.05),  # as the launch's --color-lr
                            progress=False)["runs"][0]
    distributed = saved["runs"][0]
    assert abs(distributed["average_accuracy"] - single["average_accuracy"]) <= 0.05, (distributed, single)
    assert distributed["trainable_parameters_per_experience"] == single["trainable_parameters_per_experience"]


def test_comparison_runner_refuses_methods_without_distributed_support(tmp_path):
    from avalanche_color.runner import RunConfig, RunConfigError
    from avalanche_color.runner.comparison import check_distributed  # what the runner checks under torchrun first

    config = RunConfig(benchmark="digits_class", methods=("CoLoR", "L2P", "Naive"), out=tmp_path)
    with pytest.raises(RunConfigError, match=r"\['L2P', 'Naive'\] under torchrun.*CoLoR"):
        check_distributed(config)
    with pytest.raises(RunConfigError, match="resume is not supported under torchrun"):
        check_distributed(RunConfig(benchmark="digits_class", methods=("CoLoR",), resume=True))


# ---------------------------------------------------------------------- NCCL, collectives, devices


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")  # before two_ranks starts its gloo run
def test_two_gpus_under_nccl_match_the_gloo_run(tmp_path, two_ranks):
    launch_two_ranks(tmp_path, ("prototypes",), backend="nccl")
    first, second = ranks_of(tmp_path, "prototypes")
    assert [first["device"], second["device"]] == ["cuda:0", "cuda:1"]
    assert torch.equal(first["prototypes"], second["prototypes"]) and torch.equal(first["owners"], second["owners"])
    assert torch.equal(first["owners"], two_ranks[0]["owners"])
    torch.testing.assert_close(first["prototypes"], two_ranks[0]["prototypes"], atol=1e-3, rtol=1e-3)
    assert abs(first["accuracy"] - two_ranks[0]["accuracy"]) <= 0.05
    for experience, labels in two_ranks[0]["seen_labels"].items():
        assert torch.equal(first["seen_labels"][experience], labels)


def test_tensor_collectives_move_tensors_without_pickling_them(gloo_launch):
    # The code path NCCL takes (tensor all_gather and broadcast, shapes first), run on gloo with CPU tensors
    # (collectives_run.py, the launch's case collectives).
    first, second = ranks_of(gloo_launch, "collectives")
    for rank in (first, second):
        # Rank 0 gives 3 rows, rank 1 none (an empty shard), then 2 rows: gathered in rank order.
        assert torch.equal(rank["gathered"], torch.arange(5 * 4, dtype=torch.float32).reshape(5, 4))
        assert torch.equal(rank["empty_then_rows"], torch.tensor([7, 8], dtype=torch.int64))
        assert rank["bf16"].dtype == torch.bfloat16 and torch.equal(rank["bf16"], first["bf16"])
        assert torch.equal(rank["broadcast"], torch.arange(24, dtype=torch.float64).reshape(2, 3, 4))
        assert rank["broadcast_dtype"] == torch.float64
    assert first["pickled"] == second["pickled"] == 0


@pytest.mark.parametrize("environ, use_cuda, expected", [
    ({"LOCAL_RANK": "3", "RANK": "11", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, True, "cuda:3"),
    ({"LOCAL_RANK": "0", "RANK": "8", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, True, "cuda:0"),
    ({"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"}, True, "cuda:1"),
    ({"LOCAL_RANK": "5", "RANK": "13", "WORLD_SIZE": "16"}, False, "cpu"),
])
def test_each_rank_takes_the_gpu_of_its_local_rank_on_its_own_node(environ, use_cuda, expected, monkeypatch):
    from avalanche_color.training.distributed import local_device

    for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert local_device(use_cuda) == torch.device(expected)  # read from os.environ
    assert local_device(use_cuda, environ) == torch.device(expected)  # or from the mapping given


def test_init_distributed_makes_avalanches_helper_answer_the_local_rank_device(monkeypatch):
    # Avalanche's make_device maps to cuda:{RANK}; after init_distributed it answers cuda:{LOCAL_RANK}.
    from avalanche.distributed import DistributedHelper

    from avalanche_color.training import distributed

    calls = {}
    monkeypatch.setattr(DistributedHelper, "init_distributed",
                        lambda seed, backend, use_cuda: calls.update(seed=seed, backend=backend, use_cuda=use_cuda))
    monkeypatch.setattr(DistributedHelper, "use_cuda", True, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.setdefault("set", []).append(str(device)))
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("RANK", "10")
    try:
        device = distributed.init_distributed(7)
        assert device == torch.device("cuda:2") and DistributedHelper.make_device() == torch.device("cuda:2")
        assert calls["backend"] == "nccl" and calls["use_cuda"] and calls["seed"] == 7
        assert calls["set"] == ["cuda:2"]  # before the process group starts, as NCCL needs
    finally:
        vars(DistributedHelper).pop("make_device", None)  # Avalanche's own method again
