"""One expert and one head per experience on a frozen ViT, routed per sample; shared by CoLoR and S-Prompts."""
