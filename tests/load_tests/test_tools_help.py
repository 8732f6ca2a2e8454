"""Every tool that writes a result names its module path in its help and says how a checkout
without .git records its commit (SERVE_APP_CODE_COMMIT, recorded as code_commit)."""

from __future__ import annotations

import importlib

import pytest

TOOLS = {
    "load_tests.bench": "load_tests.bench.cli",
    "load_tests.reliability.faults": "load_tests.reliability.faults",
    "load_tests.reliability.gpu_faults": "load_tests.reliability.gpu_faults",
    "load_tests.reliability.soak": "load_tests.reliability.soak",
    "load_tests.benchmarks.throughput": "load_tests.benchmarks.throughput.cli",
    "load_tests.benchmarks.startup": "load_tests.benchmarks.startup.cli",
    "load_tests.benchmarks.multigpu": "load_tests.benchmarks.multigpu.cli",
    "load_tests.benchmarks.stack": "load_tests.benchmarks.stack.cli",
    "load_tests.benchmarks.planproof": "load_tests.benchmarks.planproof.cli",
    "load_tests.benchmarks.first_seconds": "load_tests.benchmarks.first_seconds",
}


@pytest.mark.parametrize("prog,module", sorted(TOOLS.items()))
def test_help_names_the_module_and_the_commit_variable(
    prog: str, module: str, capsys: pytest.CaptureFixture
) -> None:
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert text.startswith(f"usage: python -m {prog} ")
    assert "SERVE_APP_CODE_COMMIT=<commit>" in text and "code_commit" in text
