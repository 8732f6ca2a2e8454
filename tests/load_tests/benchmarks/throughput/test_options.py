"""load_tests.benchmarks.throughput.options: core lists, the default split of the cores and the
GPU share option."""

from __future__ import annotations

import pytest

from load_tests.benchmarks.throughput.options import (
    default_cores,
    format_cores,
    parse_cores,
    shared_physical_cores,
)
from load_tests.benchmarks.throughput.setups import serve_app_doc


def test_core_lists() -> None:
    assert parse_cores("0-3,8, 10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cores([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert default_cores(range(32), _alone) == (list(range(16)), list(range(16, 32)))
    assert default_cores([0, 1], _alone) == ([0], [1])
    assert default_cores([3], _alone) == ([3], [3])


def _alone(cpu: int) -> set[int]:
    return {cpu}


def _pairs(cpu: int) -> set[int]:
    """CPU n and n + 16 share a physical core, as on many 32-thread hosts."""
    return {cpu % 16, cpu % 16 + 16}


def test_default_cores_keep_hyperthread_siblings_on_one_side() -> None:
    siblings = _pairs
    server, client = default_cores(range(32), siblings)
    assert server == [*range(0, 8), *range(16, 24)]
    assert client == [*range(8, 16), *range(24, 32)]
    assert shared_physical_cores(server, client, siblings) == []
    naive = shared_physical_cores(list(range(16)), list(range(16, 32)), siblings)
    assert naive[:2] == [(0, 16), (1, 17)] and len(naive) == 16
    for bad in ("", "3-1", "a", "-1"):
        with pytest.raises(ValueError):
            parse_cores(bad)


def test_replica_share_option_sets_every_replicas_gpu_share() -> None:
    from load_tests.benchmarks.throughput.options import build_parser, make_config
    from load_tests.benchmarks.throughput.setups import gpu_share

    parser = build_parser()
    argv = ["--out", "/tmp/x", "--gpu", "0,1", "--replica-share", "0.25", "--replicas", "4,8"]
    cfg = make_config(parser.parse_args(argv), parser)
    assert (cfg["gpu"], cfg["replica_share"], cfg["replicas"]) == ("0,1", 0.25, [4, 8])
    for n in (4, 8):  # 4 x 0.25 fill one GPU; 8 x 0.25 fill two
        dep = serve_app_doc("minilm", n, cfg, 8123)["applications"][0]["deployments"][0]
        assert dep["num_replicas"] == n and dep["ray_actor_options"]["num_gpus"] == 0.25
    default = make_config(parser.parse_args(["--out", "/tmp/x"]), parser)
    assert default["replica_share"] is None and gpu_share(8, default) == 0.12
    with pytest.raises(SystemExit):
        make_config(parser.parse_args(["--out", "/tmp/x", "--replica-share", "1.5"]), parser)


def test_send_lag_bound_is_strict_for_measurements_and_loose_for_the_quick_check() -> None:
    from load_tests.benchmarks.throughput.options import build_parser, make_config

    parser = build_parser()

    def bound(*argv: str) -> float:
        return make_config(parser.parse_args(["--out", "/tmp/x", *argv]), parser)[
            "max_send_lag_p99_ms"
        ]

    assert bound() == 5.0
    assert bound("--device", "cpu") == 5.0
    assert bound("--device", "cpu", "--quick") == 25.0
    assert bound("--quick", "--max-send-lag-p99-ms", "2") == 2.0
    with pytest.raises(SystemExit):
        bound("--max-send-lag-p99-ms", "0")


def test_serve_app_layers_rewrite_only_serve_apps_minilm() -> None:
    import json
    from pathlib import Path

    from load_tests.benchmarks.throughput.options import build_parser, make_config
    from load_tests.benchmarks.throughput.setups import serve_app_doc
    from serve_app.adapters.embeddings.modeldir import SKELETON_DIR

    parser = build_parser()
    argv = ["--out", "/tmp/x", "--device", "cpu", "--models", "minilm"]
    cfg = make_config(parser.parse_args([*argv, "--phases", "client,serve,noop"]), parser)
    assert cfg["serve_app_layers"] is None
    args = serve_app_doc("minilm", 1, cfg, 8123)["applications"][0]["args"]
    assert "model_path" not in args
    cfg = make_config(
        parser.parse_args([*argv, "--phases", "serve,noop", "--serve-app-layers", "0"]), parser
    )
    args = serve_app_doc("minilm", 1, cfg, 8123)["applications"][0]["args"]
    path = Path(args["model_path"])
    assert args["load_format"] == "dummy"
    full = json.loads((SKELETON_DIR / "config.json").read_text())
    assert json.loads((path / "config.json").read_text()) == {**full, "num_hidden_layers": 0}
    assert (path / "tokenizer.json").read_bytes() == (SKELETON_DIR / "tokenizer.json").read_bytes()
    for bad in (["--serve-app-layers", "-1"], ["--serve-app-layers", "0"]):  # the second: ceiling
        with pytest.raises(SystemExit):
            make_config(parser.parse_args([*argv, *bad]), parser)
