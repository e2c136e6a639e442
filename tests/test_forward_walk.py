"""benchmarks.investigations.forward_walk traces what an eval batch runs: one routing pass, and the frozen-expert
kernel that fits the batch (updates added in place for several experts, a merged weight for one)."""

import torch

from benchmarks.investigations.forward_walk import EXPERIENCES, is_function, tiny_stream, trained_strategy, walk


def test_the_walk_routes_once_and_picks_the_kernel_of_the_batch(one_thread):
    benchmark = tiny_stream()
    strategy = trained_strategy("CoLoR", "prototypes")
    for experience in benchmark.train_stream:
        strategy.train(experience)
    tests = benchmark.test_stream
    mixed = torch.stack([tests[e].dataset[0][0] for e in range(EXPERIENCES)])
    single = torch.stack([tests[0].dataset[i][0] for i in range(3)])
    tasks = torch.arange(EXPERIENCES)

    mixed_walk = [name for _, name in walk(strategy, mixed, tasks, tests[0])]
    assert len(set(strategy.mb_routed_experts.tolist())) > 1
    single_walk = [name for _, name in walk(strategy, single, tasks, tests[0])]
    assert strategy.mb_routed_experts.tolist() == [0, 0, 0]

    for names in (mixed_walk, single_walk):
        assert names[0] == "RoutedExpertsTemplate.forward" and names.count("PrototypeRouter.forward") == 1
        assert names[-1] == "ExpertHead.forward"
    assert "_add_qv_update_" in mixed_walk and "QKVExperts.merged_weight" not in mixed_walk
    assert "QKVExperts.merged_weight" in single_walk and "_add_qv_update_" not in single_walk
    assert not is_function(strategy, "RoutedExpertViT.num_experts")  # a property
    assert is_function(strategy, "RoutedExpertViT.route")
