"""Measuring and logging runs: the routing-accuracy metric and a W&B logger for current wandb."""
