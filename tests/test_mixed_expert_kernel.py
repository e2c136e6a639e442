"""The mixed-expert kernels: a batch that mixes experts, computed by runs of a sorted batch ("segments") or
with each sample's factors and head gathered by its expert index ("gathered"), equals each expert alone;
the gathered kernel's operators do not grow with the experts in a batch and it makes no host sync."""

from __future__ import annotations

import pytest
import torch

from avalanche_color import ExpertViT, QKVExperts
from avalanche_color.experts.routed_vit import gathers, predict
from benchmarks.gpu_checklist.host_reads import HostReads, counting
from benchmarks.perf.kernels import count_operators
from streams import IMAGE_SIZE, tiny_vit

CLASSES = ([0, 1], [2, 3, 4], [5], [1, 6])  # different counts: the gathered heads are padded


def random_experts(dtype: torch.dtype = torch.float64, trains: bool = False) -> ExpertViT:
    """Four experts with random weights (non-zero B, random heads); the newest trains if ``trains``."""
    model = ExpertViT(tiny_vit(), rank=4).eval()
    for classes in CLASSES:
        model.start_expert(classes)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".experts." in name or name.startswith("bank.heads."):
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
    model.bank.set_trainable(len(CLASSES) - 1 if trains else None)
    return model.to(dtype)


def images(n: int, dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(seed)).to(dtype)


def logits_by(model: ExpertViT, kernel: str, x: torch.Tensor, experts) -> torch.Tensor:
    model.mixed_kernel = kernel
    return model.predict(x, experts)


def assert_same_logits(actual: torch.Tensor, expected: torch.Tensor, tolerance: float = 1e-12) -> None:
    """-inf in the same places, the finite logits equal up to float64 rounding."""
    assert torch.equal(torch.isinf(actual), torch.isinf(expected))
    known = torch.isfinite(expected)
    torch.testing.assert_close(actual[known], expected[known], rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("trains", [False, True], ids=["all frozen", "the newest trains"])
@pytest.mark.parametrize("kernel", ["segments", "gathered"])
def test_every_row_of_a_mixed_batch_equals_its_expert_alone(kernel, trains):
    model = random_experts(trains=trains)
    x = images(9)
    experts = torch.tensor([3, 0, 1, 1, 2, 0, 3, 2, 1])
    with torch.no_grad():
        mixed = logits_by(model, kernel, x, experts)
        for row, expert in enumerate(experts.tolist()):
            alone = logits_by(model, "segments", x[row : row + 1], expert)  # today's single-expert path
            assert_same_logits(mixed[row : row + 1], alone)
            assert torch.isfinite(mixed[row]).nonzero().squeeze(1).tolist() == CLASSES[expert]


@pytest.mark.parametrize("experts", [[2, 2, 2, 2], [0, 3, 0, 3], [1, 0, 3, 2], []], ids=["one", "two", "four", "empty"])
def test_both_kernels_give_the_same_logits(experts):
    model = random_experts()
    x = images(len(experts))
    experts = torch.tensor(experts, dtype=torch.long)
    with torch.no_grad():
        assert_same_logits(logits_by(model, "gathered", x, experts), logits_by(model, "segments", x, experts))


def test_the_layer_pads_experts_of_other_ranks_and_scalings():
    torch.manual_seed(0)
    layer = QKVExperts(torch.nn.Linear(12, 36).double())
    for rank, alpha in ((2, 2.0), (5, 1.0), (3, 6.0)):
        expert = layer.new_expert(rank, alpha)
        layer.experts.append(expert)
        torch.nn.init.normal_(expert.B)
    layer.double()
    x = torch.randn(6, 7, 12, dtype=torch.float64)
    experts = torch.tensor([2, 0, 1, 2, 1, 0])
    gathered = layer(x, experts)
    order = experts.argsort(stable=True)
    runs = [(0, slice(0, 2)), (1, slice(2, 4)), (2, slice(4, 6))]
    segments = torch.empty_like(gathered)
    segments[order] = layer(x[order], runs)
    torch.testing.assert_close(gathered, segments, rtol=1e-12, atol=1e-12)
    for row, expert in enumerate(experts.tolist()):
        torch.testing.assert_close(gathered[row], layer(x[row : row + 1], expert)[0], rtol=1e-12, atol=1e-12)


def test_in_a_gathered_batch_gradients_reach_only_the_expert_that_trains_and_equal_its_own():
    newest = len(CLASSES) - 1
    x = images(6)
    experts = torch.tensor([newest, 0, 1, 1, 0, newest])
    model = random_experts(trains=True).train()
    model.mixed_kernel = "gathered"
    model(x, experts=experts)[:, 6].sum().backward()  # class 6: the newest expert's own class
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    assert grads and all(f".experts.{newest}." in name or name.startswith(f"bank.heads.{newest}.") for name in grads)
    alone = random_experts(trains=True).train()
    alone(x[[0, 5]], experts=newest)[:, 6].sum().backward()  # the training path: low-rank, one expert
    for name, parameter in alone.named_parameters():
        if parameter.grad is not None:
            torch.testing.assert_close(grads[name], parameter.grad, rtol=1e-10, atol=1e-10)


def test_the_stacked_experts_follow_every_change():
    model = random_experts()
    x = images(4)
    experts = torch.tensor([0, 1, 2, 3])

    def check() -> None:
        with torch.no_grad():
            assert_same_logits(logits_by(model, "gathered", x, experts), logits_by(model, "segments", x, experts))

    check()
    with torch.no_grad():  # in place, as an optimiser or load_state_dict writes
        model.qkv_layers[1].experts[2].B.mul_(3)
        model.bank.heads[1].linear.weight.add_(1)
    check()
    model.load_state_dict(random_experts().state_dict())
    check()
    model.bank.set_trainable(1)  # a slot taken live
    check()
    model.bank.set_trainable(None)
    model.start_expert([7, 8])  # one more expert (it trains)
    experts = torch.tensor([4, 1, 4, 3])
    check()
    model.float()  # cast: new storage
    x = x.float()
    with torch.no_grad():
        assert_same_logits(logits_by(model, "gathered", x, experts), logits_by(model, "segments", x, experts), 1e-5)


def test_the_gathered_operators_do_not_grow_with_the_experts_in_a_batch():
    model = random_experts()
    x = images(8)
    num_classes = model.num_classes

    def operators(kernel: str, experts: list[int]) -> int:
        def run():
            return predict(model.features, model.bank.heads, num_classes, x, torch.tensor(experts), None, kernel)
        run()  # the stacks are built once, then cached
        return sum(count_operators(run).values())

    two, four = [0, 1] * 4, [0, 1, 2, 3] * 2
    assert operators("gathered", two) == operators("gathered", four)
    assert operators("segments", four) > operators("segments", two)


@pytest.mark.parametrize("trains", [False, True], ids=["evaluation", "the newest trains, with gradients"])
def test_torch_compile_takes_a_gathered_mixed_batch_as_one_graph(trains):
    """No graph break (none at the stacks' cache either), so no recompile per batch layout; the segments'
    data-dependent runs break the graph, which shows the count can see a break."""
    import torch._dynamo as dynamo

    model = random_experts(torch.float32, trains=trains)
    x = images(8, torch.float32)
    experts = torch.tensor([3, 0, 1, 1, 2, 0, 3, 2])
    num_classes = model.num_classes

    def graphs(kernel: str):
        dynamo.reset()
        with torch.set_grad_enabled(trains):
            return dynamo.explain(lambda x, e: predict(model.features, model.bank.heads, num_classes, x, e, None,
                                                       kernel))(x, experts)

    gathered, segments = graphs("gathered"), graphs("segments")
    dynamo.reset()
    assert (gathered.graph_count, gathered.graph_break_count) == (1, 0), gathered.break_reasons
    assert segments.graph_break_count > 0


@pytest.mark.parametrize("batch, count", [(4, 2), (12, 4)])
def test_host_syncs_of_an_evaluation_batch_do_not_depend_on_its_size_or_experts(batch, count):
    model = random_experts()
    x = images(batch)
    experts = torch.arange(batch) % count
    num_classes = model.num_classes
    reads = HostReads()
    with torch.no_grad(), counting(reads):
        for kernel, allowed in (("gathered", 0), ("segments", 1)):
            reads.open(kernel)
            predict(model.features, model.bank.heads, num_classes, x, experts, None, kernel)
            reads.close()
            assert sum(reads.per(kernel)[0].values()) == allowed, kernel


def test_auto_gathers_on_cuda_only_and_other_names_are_refused():
    assert gathers("auto", torch.device("cuda")) and not gathers("auto", torch.device("cpu"))
    assert gathers("gathered", torch.device("cpu")) and not gathers("segments", torch.device("cuda"))
    model = random_experts()
    assert model.mixed_kernel == "auto"
    with pytest.raises(ValueError, match="mixed_kernel must be one of 'auto', 'segments', 'gathered', got 'sorted'"):
        logits_by(model, "sorted", images(2), torch.tensor([0, 1]))


def test_the_gathered_kernel_runs_under_bf16_autocast():
    model = random_experts(torch.float32)
    x = images(6, torch.float32)
    experts = torch.tensor([0, 1, 2, 3, 0, 1])
    with torch.no_grad():
        reference = logits_by(model, "segments", x, experts)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = logits_by(model, "gathered", x, experts)
    assert low.dtype == reference.dtype
    assert_same_logits(low, reference, tolerance=0.1 * reference[torch.isfinite(reference)].abs().max().item())


@pytest.mark.cuda
def test_on_cuda_auto_gathers_and_equals_the_segments():
    model = random_experts().cuda()
    x = images(8).cuda()
    experts = torch.tensor([3, 0, 1, 1, 2, 0, 3, 2]).cuda()
    num_classes = model.num_classes
    with torch.no_grad():
        auto = logits_by(model, "auto", x, experts)
        torch.cuda.set_sync_debug_mode("error")  # any host sync raises
        try:
            gathered = predict(model.features, model.bank.heads, num_classes, x, experts, None, "gathered")
        finally:
            torch.cuda.set_sync_debug_mode("default")
        segments = logits_by(model, "segments", x, experts)
    assert_same_logits(auto, segments, 1e-10)
    assert_same_logits(gathered, segments, 1e-10)
