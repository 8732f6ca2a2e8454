#!/usr/bin/env bash
# Compile Python bytecode for what a replica imports, as pip does by default when it installs.
# The GPU host installs its wheels with --no-compile and sets PYTHONDONTWRITEBYTECODE=1, so
# without this every Ray worker compiles Ray, Serve, pydantic, FastAPI... from source as it
# starts (load_tests/import_probe: 13 to 18 s of imports per process there; docs/controller.md).
# Writable package directories get __pycache__ in place. If one is read-only, all of it (and
# the standard library) goes under a PYTHONPYCACHEPREFIX instead, which the caller exports:
# Usage: eval "$(bash scripts/compile_bytecode.sh)"   (after the GPU host's install line)
set -u
python3 -W ignore - <<'PY'
import compileall, importlib.util, os, sys, sysconfig, time

t0 = time.perf_counter()
sites = set()
for name in ("torch", "transformers", "torchvision", "ray", "fastapi", "pydantic"):
    spec = importlib.util.find_spec(name)
    if spec and spec.submodule_search_locations:
        sites.add(os.path.dirname(list(spec.submodule_search_locations)[0]))
dirs = sorted(sites) + [os.path.join(os.getcwd(), d) for d in ("serve_app", "load_tests")]
prefix = None
if not all(os.access(d, os.W_OK) for d in dirs):
    prefix = "/tmp/pycache"
    sys.pycache_prefix = prefix
    dirs.append(sysconfig.get_paths()["stdlib"])
for d in dirs:
    compileall.compile_dir(d, quiet=2, workers=os.cpu_count() or 1)
took = time.perf_counter() - t0
print(f"echo 'bytecode: {len(dirs)} trees compiled in {took:.0f} s (prefix: {prefix})'")
if prefix:
    print(f"export PYTHONPYCACHEPREFIX={prefix}")
PY
