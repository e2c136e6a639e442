"""The methods CoLoR is compared with, each as its authors' code runs it.

The prompt methods: S-Prompts (routed prompt experts) and L2P (a prompt pool). The LoRA methods that
route nothing: SD-LoRA, InfLoRA and LoRA subtraction (a sum of LoRA components in one ViT), and
CL-LoRA (shared adapters and one set of adapters per experience, prototypes per class).
"""
