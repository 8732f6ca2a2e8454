#!/usr/bin/env bash
# Compile Python bytecode for what a replica imports, as pip does by default when it installs.
# The GPU host installs torch and our wheels without bytecode and sets PYTHONDONTWRITEBYTECODE=1,
# so without this every Ray worker compiles torch, transformers, Ray... from source as it
# starts (research/import_probe: 13 to 24 s of imports per process there; docs/controller.md).
# Writes __pycache__ next to the sources (the directories must be writable, as they are there).
# Usage: bash scripts/compile_bytecode.sh   (after the GPU host's install line)
set -u
T0=$(date +%s)
DIRS=$(python3 - <<'PY'
import importlib.util, os
sites = set()
for name in ("torch", "transformers", "torchvision", "ray", "fastapi", "pydantic", "numpy"):
    spec = importlib.util.find_spec(name)
    if spec and spec.submodule_search_locations:
        sites.add(os.path.dirname(list(spec.submodule_search_locations)[0]))
print(" ".join(sorted(sites) + ["serve_app", "load_tests"]))
PY
)
# -j 0: one process per core; tests and benchmarks inside packages are skipped.
python3 -W ignore -m compileall -q -j 0 -x '/(tests?|testing|benchmarks)/' $DIRS > /dev/null 2>&1
echo "bytecode compiled in $(( $(date +%s) - T0 )) s: $DIRS"
