"""The value checks shared by the methods' options and the runner's settings: one message for one problem."""

import pytest

from avalanche_color import CoLoRConfig
from avalanche_color.runner import RunConfig
from avalanche_color.runner.config import RunConfigError
from avalanche_color.utils.checks import (boolean, each, fraction, integer, non_negative_int, one_of, open_fraction,
                                          optional, positive, positive_int, require, subset_of)


@pytest.mark.parametrize("check, good, bad", [
    (integer, [0, -3, 7], [True, 1.0, "1", None]),
    (positive_int, [1, 64], [0, -1, True, 2.0, "8"]),
    (non_negative_int, [0, 5], [-1, False, 0.5]),
    (positive, [1, 0.5, 1e-9], [0, -0.1, True, "1", float("nan")]),
    (fraction, [1, 0.5], [0, 1.5, True, float("nan")]),
    (open_fraction, [0.5, 0.01], [0, 1, True, float("nan")]),
    (boolean, [True, False], [0, 1, "True", None]),
    (one_of(("sgd", "adam")), ["sgd", "adam"], ["SGD", None, 0]),
    (optional(positive_int), [None, 3], [0, "3"]),
    (each(positive_int), [(1,), [2, 3]], [(), (0,), 3, "ab"]),
    (subset_of(("a", "b"), allow_empty=True), [(), ("a",), ["b", "a"]], [("c",), "a", None]),
])
def test_a_check_accepts_the_good_values_and_names_a_problem_for_the_bad(check, good, bad):
    assert [check(value) for value in good] == [None] * len(good)
    assert all(isinstance(check(value), str) and check(value).startswith("must") for value in bad)


def test_require_names_the_argument_the_value_and_what_is_allowed():
    with pytest.raises(ValueError, match=r"^rank must be an integer >= 1, got '8'$"):
        require("rank", "8", positive_int)
    with pytest.raises(ValueError, match=r"^ranks must each be an integer >= 1, got \(4, 0\)$"):
        require("ranks", (4, 0), each(positive_int))
    with pytest.raises(ValueError, match=r"^loggers must be among \('text', 'csv'\) \(not 'stdout'\), got"):
        require("loggers", ("text", "stdout"), subset_of(("text", "csv")))
    require("rank", 8, positive_int)  # a good value passes silently


def test_an_option_and_a_runner_setting_give_the_same_problem_for_the_same_value():
    with pytest.raises(ValueError) as option_error:
        CoLoRConfig(rank=0)
    with pytest.raises(RunConfigError) as setting_error:
        RunConfig(benchmark="digits_class", ranks=(0,))
    assert str(option_error.value) == "rank must be an integer >= 1, got 0"
    assert setting_error.value.problem == "must each be an integer >= 1"
