"""Small helpers used across the repository: atomic file writes, random-generator states."""
