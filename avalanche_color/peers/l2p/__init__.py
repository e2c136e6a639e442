"""Learning to Prompt: a shared prompt pool with keys, on any timm ViT."""
