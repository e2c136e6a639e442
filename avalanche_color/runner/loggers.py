"""The loggers of one run: Avalanche's text, CSV and Tensorboard loggers, and W&B."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

from avalanche.logging import CSVLogger, TensorboardLogger, TextLogger

from avalanche_color.runner.config import RunConfig
from avalanche_color.runner.plan import PlannedRun
from avalanche_color.runner.provenance import config_record, jsonable


def avalanche_loggers(names: tuple[str, ...], folder: Path, stack: ExitStack, append: bool = False) -> list:
    folder.mkdir(parents=True, exist_ok=True)
    loggers: list = []
    if "text" in names:
        loggers.append(TextLogger(stack.enter_context(open(folder / "log.txt", "a" if append else "w"))))
    if "csv" in names:
        loggers.append(CSVLogger(log_folder=str(folder / "csv")))
    if "tensorboard" in names:
        loggers.append(TensorboardLogger(tb_log_dir=folder / "tensorboard"))
    for logger in loggers:
        stack.callback(getattr(logger, "close", lambda: None))
    return loggers


def wandb_logger(config: RunConfig, planned: PlannedRun, options: dict[str, Any], folder: Path):
    """The package's W&B logger for one run (None without ``wandb_project``): the run's config holds
    the method's own options (``options``: rank, k, lr, ...), its seed and the comparison's settings."""
    if config.wandb_project is None:
        return None
    import wandb

    from avalanche_color import WandBLogger

    (folder / "wandb").mkdir(parents=True, exist_ok=True)
    run_config = {"comparison": config_record(config), "method": planned.method, "label": planned.label,
                  "seed": planned.seed, **jsonable(options)}
    return WandBLogger(project_name=config.wandb_project, run_name=f"{config.benchmark} {planned.label} "
                                                                  f"seed {planned.seed}",
                       dir=str(folder / "wandb"), config=run_config, save_code=False,
                       params={"entity": config.wandb_entity, "group": config.benchmark, "job_type": planned.label,
                               "reinit": "create_new",  # one run per (method, seed), even in a notebook
                               # where the run is saved, not its history and summary: those are in the
                               # table the runner prints, and would break up its progress bar per run
                               "settings": wandb.Settings(quiet=True, console="off")})
