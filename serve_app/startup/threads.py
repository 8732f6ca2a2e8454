"""The tokenizer's threads, sized to the replica's cores.

The Rust tokenizer (``tokenizers``) runs ``encode_batch`` on rayon's global pool, which rayon
sizes to every core of the host unless ``RAYON_NUM_THREADS`` says otherwise, so every replica
would keep a pool as large as the host, whose workers spin before they park: CPU taken from the
neighbours for nothing (benchmarks/results/profile/throughput_r12_h200_16cores_14c8268,
benchmarks/results/cpu_tokens/tokenizer_threads.json). Ray gives the replica ``num_cpus``
cores and says so in ``OMP_NUM_THREADS``; the tokenizer gets the same: one core, no pool at all
(``TOKENIZERS_PARALLELISM=false``, the calling thread encodes); more, a pool of that size.
Settings the deployment already has (its ``runtime_env``) are left as they are.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping


def size_tokenizer_threads(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the tokenizer's thread settings in ``environ`` (default ``os.environ``) from
    ``OMP_NUM_THREADS`` (the replica's cores, as Ray sets it) before the first ``encode_batch``;
    what was set (empty when the deployment set either variable itself, or there is no core
    count to follow)."""
    env = os.environ if environ is None else environ
    if "TOKENIZERS_PARALLELISM" in env or "RAYON_NUM_THREADS" in env:
        return {}
    text = env.get("OMP_NUM_THREADS", "")
    cores = int(text) if text.isdigit() else 0
    if cores < 1:
        return {}
    chosen = (
        {"TOKENIZERS_PARALLELISM": "false"} if cores == 1 else {"RAYON_NUM_THREADS": str(cores)}
    )
    env.update(chosen)
    return chosen
