"""S-Prompts: one set of prompt tokens per experience, routed like CoLoR's experts."""
