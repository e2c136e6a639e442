"""What SD-LoRA and InfLoRA share: a sum of LoRA components in one ViT, one classifier, their training and files."""
