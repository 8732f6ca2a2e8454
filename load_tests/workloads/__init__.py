"""Request workloads shared by the benchmarks: what the texts are and how long."""
