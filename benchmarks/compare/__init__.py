"""``python -m benchmarks.compare``: the form of the command the committed results record (see ``__main__``)."""
