"""What SD-LoRA, InfLoRA and LoRA subtraction share: their training options (config.py), a sum of LoRA components
in one ViT with one classifier, and its files (model.py), their training (strategy.py)."""
