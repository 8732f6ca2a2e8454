"""load_tests.payloads: deterministic texts and images, and the default model names."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from load_tests import bench, payloads

ROOT = Path(__file__).resolve().parents[2]


def test_texts_deterministic_and_sized() -> None:
    assert payloads.texts("mixed", 20, seed=3) == payloads.texts("mixed", 20, seed=3)
    assert payloads.texts("short", 5, seed=3) != payloads.texts("short", 5, seed=4)
    for text in payloads.texts("short", 50, seed=1):
        assert 3 <= len(text.split()) <= 8
    for text in payloads.texts("long", 20, seed=1):
        assert 150 <= len(text.split()) <= 200
        assert text.count("\n\n") >= 2  # several paragraphs
    with pytest.raises(ValueError, match="text kind"):
        payloads.texts("medium", 1)


@pytest.mark.parametrize("fmt", ["jpeg", "png"])
@pytest.mark.parametrize("size", [224, 512])
def test_images_decode_at_requested_size(fmt: str, size: int) -> None:
    data = payloads.image_bytes(size, fmt, seed=2)
    assert data == payloads.image_bytes(size, fmt, seed=2)
    img = Image.open(io.BytesIO(data))
    assert img.format == fmt.upper()
    assert img.size == (size, size)
    assert img.mode == "RGB"
    img.load()


def test_images_deterministic_across_cache() -> None:
    a = payloads.image_bytes(64, "png", seed=5)
    payloads.image_bytes.cache_clear()
    payloads.image_b64.cache_clear()
    assert payloads.image_bytes(64, "png", seed=5) == a


def test_default_model_names_are_what_serve_app_serves() -> None:
    """The clients' defaults must be names the README's server answers to (else every request
    is a 404): configs/default.yaml's model, AppArgs' default, and an image app's default."""
    import yaml

    from serve_app.config.args import parse_args

    default_yaml = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    served = default_yaml["applications"][0]["args"]["model_name"]
    assert payloads.DEFAULT_EMBEDDINGS_MODEL == served == "all-MiniLM-L6-v2"
    assert parse_args({}).model_name == payloads.DEFAULT_EMBEDDINGS_MODEL
    image_default = parse_args({"adapter": "image-classification"}).model_name
    assert payloads.DEFAULT_IMAGE_MODEL == image_default == "resnet50"
    assert bench.DEFAULT_MODELS == {"embeddings": "all-MiniLM-L6-v2", "image": "resnet50"}
    assert json.loads(payloads.embeddings_body("x"))["model"] == "all-MiniLM-L6-v2"
    assert json.loads(payloads.classify_body("eA=="))["model"] == "resnet50"


def test_embeddings_body_encoding_format() -> None:
    assert "encoding_format" not in json.loads(payloads.embeddings_body(["a", "b"]))
    body = json.loads(payloads.embeddings_body(["a", "b"], encoding_format="base64"))
    assert body == {"model": "all-MiniLM-L6-v2", "input": ["a", "b"], "encoding_format": "base64"}
