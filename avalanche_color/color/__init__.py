"""CoLoR itself: the LoRA-expert model, the strategy, and the plugin that gives any strategy its experts."""
