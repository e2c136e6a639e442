"""InfLoRA (Liang & Li, CVPR 2024): each task's LoRA designed outside the inputs of earlier tasks, on any timm ViT."""
