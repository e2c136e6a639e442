"""Which expert answers a sample: k-means prototypes, nearest-prototype routing, mixed-batch segments."""
