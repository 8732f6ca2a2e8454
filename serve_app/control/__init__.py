"""The scaling path: replicas report (stats) -> the Serve policy (policy, with the ledger of bytes
promised to starting replicas) -> the pure planner (planner, its settings in settings); a monitor
actor per node (monitor) reads NVML (readings) and watches replicas' budgets (escapes)."""
