"""Small helpers used across the package: value checks and checked options, atomic file writes, random-generator
states, what an Avalanche experience says, a model's tensor state."""
