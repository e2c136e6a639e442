"""How the package's two small backbones were made (``tiny_imagenet``, ``digits``); the runner
loads them with :func:`avalanche_color.runner.load_backbone`."""
