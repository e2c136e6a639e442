"""Running a strategy: its options, checkpoint/resume, bad-data checks, several processes (torchrun)."""
