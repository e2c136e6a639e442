"""How the package's two small backbones were made (``pretrain``, ``pretrain_digits``); the runner
loads them with :func:`avalanche_color.runner.backbones.load_backbone`."""
