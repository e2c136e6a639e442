"""Measuring and logging runs: routing accuracy and the accuracy matrix, a W&B logger for current wandb,
and a progress bar per training experience."""
