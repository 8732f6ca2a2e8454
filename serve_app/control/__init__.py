"""The scaling path: the pure planner, the Serve autoscaling policy that feeds it, and the
per-node NVML monitor."""
