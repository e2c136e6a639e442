"""SD-LoRA (Wu et al., ICLR 2025): decoupled magnitudes and frozen directions of LoRA components, on any timm ViT."""
