"""The loggers of one run: Avalanche's text, CSV and Tensorboard loggers, and W&B."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from avalanche.logging import CSVLogger, TensorboardLogger, TextLogger

from benchmarks.compare.config import ComparisonConfig
from benchmarks.compare.results import config_record


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


def wandb_logger(config: ComparisonConfig, label: str, method: str, seed: int, rank: int, k: int, out: Path):
    if config.wandb_project is None:
        return None
    import wandb

    from avalanche_color import WandBLogger
    folder = out / "wandb"
    folder.mkdir(parents=True, exist_ok=True)
    run_config = {**config_record(config), "method": method, "seed": seed, "rank": rank, "k": k}
    return WandBLogger(project_name=config.wandb_project, run_name=f"{config.benchmark} {label} seed {seed}",
                       dir=str(folder), config=run_config, save_code=False,
                       params={"entity": config.wandb_entity, "group": config.benchmark, "job_type": label,
                               "reinit": "create_new",  # one run per (method, seed), even in a notebook
                               # where the run is saved, not its history and summary: those are in the
                               # table the runner prints, and would break up its progress bar per run
                               "settings": wandb.Settings(quiet=True)})
