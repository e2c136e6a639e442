"""The evidence behind single paragraphs of the docs, apart from what a user runs: each tool measured one
question once, and its README.md names the page and section it backs and the command that made it
(``python -m benchmarks.investigations.<name>``)."""
