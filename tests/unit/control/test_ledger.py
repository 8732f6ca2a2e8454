"""control.ledger: one ledger per controller process, even for a policy Ray pickled by value,
and the configs' import path (serve_app.autoscale) still names the policy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ray import cloudpickle

import serve_app.autoscale
from serve_app.control import ledger, policy

ROOT = Path(__file__).resolve().parents[3]

# Runs in a fresh process, as the Serve controller does: one policy unpickled by value (its own
# copies of the policy and ledger modules' globals) and one from the installed module.
_CONTROLLER = """
import sys
from ray import cloudpickle
from serve_app.control import ledger, policy
from tests.unit.control.builders import GIB, KWARGS, context, replica_stats

copied_cls = cloudpickle.loads(open(sys.argv[1], "rb").read())
assert copied_cls is not policy.HeadroomPolicy, "not a by-value copy"
# 17 GiB free fits one 8 GiB replica + 2 GiB margin, not two
squeezed = [replica_stats(17 * GIB)] * 2
first = copied_cls(**KWARGS)(context(name="a", load=5.0, stats=squeezed))
second = policy.HeadroomPolicy(**KWARGS)(context(name="b", load=5.0, stats=squeezed))
print(first[0], second[0], second[1]["serve_app_reason"], sorted(ledger.shared_ledger().entries))
"""


def test_a_policy_pickled_by_value_shares_the_process_ledger(tmp_path: Path) -> None:
    # As Ray pickles the module a policy_function names (AutoscalingPolicy.serialize_policy);
    # the ledger's module too: the worst case.
    for module in (policy, ledger):
        cloudpickle.register_pickle_by_value(module)
    try:
        data = cloudpickle.dumps(policy.HeadroomPolicy)
    finally:
        for module in (policy, ledger):
            cloudpickle.unregister_pickle_by_value(module)
    pickled = tmp_path / "policy.pkl"
    pickled.write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-c", _CONTROLLER, str(pickled)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["3", "2", "hold_no_headroom", "['app/a']"]


def test_the_shim_names_the_policy_configs_use() -> None:
    assert serve_app.autoscale.HeadroomPolicy is policy.HeadroomPolicy
    assert serve_app.autoscale.headroom_policy is policy.headroom_policy
