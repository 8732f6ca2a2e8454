"""The shared harness of the load tools: cluster start (``cluster``, ``ray_nodes``), load
generators (``load``, ``openloop``, ``wrk``, ``schedule``), NVML (``nvml``), another process on
the GPU (``hog``), plots (``plots``), the run's log, budget and JSON files (``run``) and what a
result records about its run (``meta``). Tools import its modules; nothing here is a command but
``plots`` (a timeline PNG), ``hog`` and ``openloop`` (the workers the tools start)."""
