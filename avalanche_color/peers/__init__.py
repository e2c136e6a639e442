"""The methods CoLoR is compared with, each as its authors' code runs it.

The prompt methods: S-Prompts (routed prompt experts) and L2P (a prompt pool). The LoRA methods:
SD-LoRA and InfLoRA (one adapted ViT with one classifier, nothing routed).
"""
