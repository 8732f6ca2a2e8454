"""Faults and long runs against a local serve_app:

python -m load_tests.reliability.faults --out faults.json             # CPU, ~2 minutes
python -m load_tests.reliability.gpu_faults --device cuda --out gpu_faults.json
python -m load_tests.reliability.soak --device cuda --duration-s 1800 --out soak.json
"""
