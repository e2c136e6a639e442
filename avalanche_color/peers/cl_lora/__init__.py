"""CL-LoRA (He, Duan, Zhu, CVPR 2025): task-shared LoRA kept by distillation, task-specific LoRA with block
weights."""
