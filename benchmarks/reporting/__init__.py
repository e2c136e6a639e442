"""Development tools that read a comparison's result files (``results.json``): the README's
tables (:mod:`.readme`), a fresh run against the committed one (:mod:`.reproduce`) and what
better routing could give (:mod:`.routing_ceiling`). The tables and metrics themselves are the
installed runner's (:mod:`avalanche_color.runner.report`)."""

from avalanche_color.runner.report import by_label, forgetting, markdown_table, summary_rows, weighted_mean

__all__ = ["by_label", "forgetting", "markdown_table", "summary_rows", "weighted_mean"]
