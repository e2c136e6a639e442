"""``python -m avalanche_color.runner compare ...``: the ``avalanche-color`` command."""

from avalanche_color.runner.cli import console

if __name__ == "__main__":
    console()
