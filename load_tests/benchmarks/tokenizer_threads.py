"""CPU seconds of the Rust tokenizer's ``encode_batch`` by its thread settings, each in a fresh
process (rayon sizes its pool once): in the calling thread (``TOKENIZERS_PARALLELISM=false``,
what serve_app sets for a one-core replica, startup/threads.py) against rayon pools of 1, 2 and
16 threads (16: what a replica on a 16-core GPU host gets by default), for each batch call
(``--calls``: ``encode_batch``, and ``encode_batch_fast``, which replicas make: the same ids
without the character offsets). Batches are spaced by a 0.5 ms sleep, as a replica's batches
are, so that the pool's workers park and wake as they do under serving.

    python -m load_tests.benchmarks.tokenizer_threads --out tokenizer_threads.json
    python -m load_tests.benchmarks.tokenizer_threads --calls encode_batch,encode_batch_fast \
      --settings 1 --out tokenizer_calls.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from load_tests.harness.meta import write_cpu_bench

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "serve_app" / "models" / "minilm-skeleton" / "tokenizer.json"
SETTINGS: dict[str, dict[str, str]] = {
    "calling thread (TOKENIZERS_PARALLELISM=false)": {"TOKENIZERS_PARALLELISM": "false"},
    "rayon pool of 1": {"RAYON_NUM_THREADS": "1"},
    "rayon pool of 2": {"RAYON_NUM_THREADS": "2"},
    "rayon pool of 16": {"RAYON_NUM_THREADS": "16"},
}
CHILD = """
import os, resource, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
texts = [f"a short query number {i} about things" for i in range(int(sys.argv[2]))]
batches = int(sys.argv[3])
call = getattr(tok, sys.argv[4])
def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
for _ in range(50):
    [e.ids for e in call(texts)]
c0, w0 = cpu_s(), time.perf_counter()
for _ in range(batches):
    [e.ids for e in call(texts)]  # the ids as Python lists, as replicas read them
    time.sleep(0.0005)
c1, w1 = cpu_s(), time.perf_counter()
print(c1 - c0, w1 - w0, len(os.listdir("/proc/self/task")))
"""


PROG = "python -m load_tests.benchmarks.tokenizer_threads"


def measure(
    env_extra: dict[str, str], texts: int, batches: int, call: str = "encode_batch"
) -> dict[str, float | int]:
    own = ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")  # only the row's setting counts
    env = {k: v for k, v in os.environ.items() if k not in own} | env_extra
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(TOKENIZER), str(texts), str(batches), call],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.split()
    cpu_s, wall_s, threads = float(out[0]), float(out[1]), int(out[2])
    return {
        "cpu_s_per_batch": cpu_s / batches,
        "wall_s_per_batch": wall_s / batches,
        "process_threads": threads,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batches", type=int, default=3000)
    p.add_argument("--texts", default="16,64", help="texts per batch, comma-separated")
    p.add_argument("--calls", default="encode_batch", help="batch calls, comma-separated")
    p.add_argument(
        "--settings", type=int, default=len(SETTINGS), help="the first N thread settings"
    )
    a = p.parse_args()
    rows = []
    for texts in (int(t) for t in a.texts.split(",")):
        for name, env_extra in list(SETTINGS.items())[: a.settings]:
            for call in a.calls.split(","):
                row = {"setting": name, "env": env_extra, "texts_per_batch": texts, "call": call}
                row.update(measure(env_extra, texts, a.batches, call))
                rows.append(row)
                print(
                    f"{texts:3d} texts, {name}, {call}: {row['cpu_s_per_batch'] * 1e6:,.0f} us "
                    f"CPU a batch, {row['process_threads']} threads"
                )
    write_cpu_bench(a.out, PROG, rows, batches=a.batches)


if __name__ == "__main__":
    main()
