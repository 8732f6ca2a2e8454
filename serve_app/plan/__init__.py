"""The planner: measurements in, a packing of replicas and GPU shares out (docs/planning.md)."""
