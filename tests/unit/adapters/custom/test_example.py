"""examples/custom_model: its config passes `serve-app check`'s checks, and the model it names
builds through the user-model adapter and answers on the CPU as its own class does (the
integration test serves it through `serve-app run`)."""

from __future__ import annotations

from pathlib import Path

import torch

from serve_app import adapters
from serve_app.config.args import parse_args
from serve_app.config.deploy import check_deploy_config, load_deploy_config

ROOT = Path(__file__).resolve().parents[4]
EXAMPLE = ROOT / "examples" / "custom_model"


def test_the_example_config_is_valid() -> None:
    doc = load_deploy_config(EXAMPLE / "config.yaml")
    assert check_deploy_config(doc) == []
    args = parse_args(doc["applications"][0]["args"])
    assert args.adapter == "examples.custom_model.model:ByteScorer"


def test_the_example_model_is_about_30_lines_and_serves_through_the_adapter() -> None:
    assert len((EXAMPLE / "model.py").read_text().splitlines()) <= 35
    doc = load_deploy_config(EXAMPLE / "config.yaml")
    model = adapters.build_model(parse_args(doc["applications"][0]["args"]))
    model.backend.setup(torch.device("cpu"))
    decoded = model.decode(b'{"inputs": ["hello", "world", ""]}', "application/json", {})
    body = model.encode(model.backend.predict(decoded.items), decoded)

    from examples.custom_model.model import ByteScorer

    own = ByteScorer(seed=0)
    own.setup(torch.device("cpu"))
    want = own.predict([own.decode_request(t) for t in ["hello", "world", ""]])
    assert body["outputs"] == want and len(set(want)) == 3
    assert len(model.backend.worst_case_items(2)) == 2  # it can be calibrated on a GPU
