"""The memory path: NVML (the one door to it), budget arithmetic, memory snapshots, the
partition (the one owner of a replica's cap and of its cache), MPS, CUDA graphs, and batch-size
calibration with its cache."""
