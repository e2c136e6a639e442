"""The prompt-based methods CoLoR is compared with: S-Prompts (routed prompt experts) and L2P (a prompt pool)."""
