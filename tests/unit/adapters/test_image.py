"""adapters.image (spec, backend and resnet): decode, preprocess, weights, predict, encode.

No Ray. Small architectures (resnet18) and small images keep the file fast on two CPU cores.
"""

from __future__ import annotations

import base64
import io
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from serve_app.adapters.contract import Model
from serve_app.adapters.image import backend as image_mod
from serve_app.adapters.image import build
from serve_app.adapters.image.backend import MEAN, STD, build_model, to_model_input
from serve_app.adapters.image.files import crop_opened, open_header, pillow_crop, read_headers
from serve_app.adapters.image.resnet import build_resnet
from serve_app.config.args import parse_args
from serve_app.errors import (
    BadRequest,
    ConfigError,
    NotFound,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from tests.fixtures import resnet_fill
from tests.fixtures.resnet_golden import ARCHS as GOLDEN_ARCHS
from tests.fixtures.resnet_golden import SOURCE_TORCHVISION

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _builtin_resnet_and_pillow_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    # The built-in ResNet even where torchvision is installed (the GPU host), and Pillow's
    # process-wide pixel limit restored after each test (the adapter sets it per decode).
    monkeypatch.setattr(image_mod, "_torchvision", lambda: None)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)


def encode_image(fmt: str, size: tuple[int, int] = (64, 48), color: Any = (200, 30, 90)) -> bytes:
    buf = io.BytesIO()
    mode = "P" if fmt == "GIF" else "RGB"
    Image.new(mode, size, color if mode == "RGB" else 3).save(buf, format=fmt)
    return buf.getvalue()


def b64(blob: bytes) -> str:
    return base64.b64encode(blob).decode()


def make_model(**args: Any) -> Model:
    base: dict[str, Any] = {
        "adapter": "image-classification",
        "arch": "resnet18",
        "load_format": "dummy",
        "image_size": 32,
    }
    base.update(args)
    return build(parse_args(base))


@pytest.fixture(scope="module")
def ready_adapter() -> Model:
    adapter = make_model(top_k=3)
    torch.manual_seed(0)
    adapter.backend.setup(CPU)
    return adapter


# ---- decode ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("fmt", "ctype"), [("JPEG", "image/jpeg"), ("PNG", "image/png")])
def test_decode_raw_body(fmt: str, ctype: str) -> None:
    adapter = make_model()
    decoded = adapter.decode(encode_image(fmt), ctype, {})
    assert len(decoded.items) == 1
    assert decoded.items[0].shape == (32, 32, 3)
    assert decoded.items[0].dtype == np.uint8
    assert decoded.meta["top_k"] == 5  # args.top_k default


def test_decode_raw_body_content_type_parameters_and_case() -> None:
    adapter = make_model()
    decoded = adapter.decode(encode_image("PNG"), "Image/PNG; charset=binary", {})
    assert len(decoded.items) == 1


def test_decode_json_base64_single_and_list() -> None:
    adapter = make_model()
    single = adapter.decode(json.dumps({"input": b64(encode_image("PNG"))}).encode(), "", {})
    assert len(single.items) == 1
    blobs = [encode_image("JPEG", color=(255, 0, 0)), encode_image("PNG", color=(0, 0, 255))]
    body = json.dumps({"input": [b64(b) for b in blobs]}).encode()
    many = adapter.decode(body, "application/json", {})
    assert len(many.items) == 2
    # order kept: item 0 is red (channel 0 high), item 1 is blue (channel 2 high)
    assert many.items[0][..., 0].mean() > many.items[0][..., 2].mean()
    assert many.items[1][..., 2].mean() > many.items[1][..., 0].mean()


def test_top_k_default_query_and_json() -> None:
    adapter = make_model(top_k=4)
    png = encode_image("PNG")
    assert adapter.decode(png, "image/png", {}).meta["top_k"] == 4
    assert adapter.decode(png, "image/png", {"top_k": "7"}).meta["top_k"] == 7
    body = json.dumps({"input": b64(png), "top_k": 2}).encode()
    assert adapter.decode(body, "application/json", {}).meta["top_k"] == 2


@pytest.mark.parametrize("bad", [0, 1001, "abc", 2.5, True, None, [3]])
def test_top_k_invalid_is_400(bad: Any) -> None:
    adapter = make_model()
    body = json.dumps({"input": b64(encode_image("PNG")), "top_k": bad}).encode()
    with pytest.raises(BadRequest) as info:
        adapter.decode(body, "application/json", {})
    assert info.value.status_code == 400
    assert info.value.param == "top_k"


def test_top_k_invalid_in_query_is_400() -> None:
    with pytest.raises(BadRequest, match="top_k"):
        make_model().decode(encode_image("PNG"), "image/png", {"top_k": "-1"})


def test_bad_base64_names_the_item() -> None:
    adapter = make_model()
    body = json.dumps({"input": [b64(encode_image("PNG")), "not base64 !!"]}).encode()
    with pytest.raises(BadRequest) as info:
        adapter.decode(body, "application/json", {})
    assert info.value.status_code == 400
    assert info.value.param == "input[1]"
    assert "input[1]" in info.value.message and "base64" in info.value.message


def test_non_image_bytes_are_400_raw_and_json() -> None:
    adapter = make_model()
    with pytest.raises(BadRequest) as raw:
        adapter.decode(b"this is not an image at all", "image/jpeg", {})
    assert raw.value.status_code == 400 and raw.value.param == "input[0]"
    body = json.dumps({"input": [b64(encode_image("PNG")), b64(b"\x00" * 100)]}).encode()
    with pytest.raises(BadRequest) as js:
        adapter.decode(body, "application/json", {})
    assert js.value.param == "input[1]"
    assert "not a readable JPEG or PNG" in js.value.message


def test_truncated_png_is_400() -> None:
    png = encode_image("PNG", size=(200, 200))
    with pytest.raises(BadRequest, match="input\\[0\\]"):
        make_model().decode(png[: len(png) // 2], "image/png", {})


def test_empty_raw_body_is_400() -> None:
    with pytest.raises(BadRequest):
        make_model().decode(b"", "image/png", {})


@pytest.mark.parametrize("fmt", ["GIF", "BMP"])
def test_other_image_formats_are_400(fmt: str) -> None:
    adapter = make_model()
    with pytest.raises(BadRequest) as info:
        adapter.decode(encode_image(fmt), "image/png", {})
    assert info.value.status_code == 400
    assert fmt in info.value.message and "only JPEG and PNG" in info.value.message
    body = json.dumps({"input": [b64(encode_image(fmt))]}).encode()
    with pytest.raises(BadRequest, match=fmt):
        adapter.decode(body, "application/json", {})


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize("size", [(200, 100), (400, 100), (2000, 2000)])
def test_image_over_max_pixels_is_413(size: tuple[int, int]) -> None:
    # 20,000 px: over the limit (10,000); 40,000 and 4,000,000: over twice the limit, where
    # Pillow itself refuses while reading the header.
    adapter = make_model(max_image_pixels=10_000)
    with pytest.raises(PayloadTooLarge) as info:
        adapter.decode(encode_image("PNG", size=size), "image/png", {})
    assert info.value.status_code == 413
    assert info.value.param == "input[0]"
    assert "max_image_pixels" in info.value.message


def test_image_at_max_pixels_is_accepted() -> None:
    adapter = make_model(max_image_pixels=10_000)
    assert len(adapter.decode(encode_image("PNG", size=(100, 100)), "image/png", {}).items) == 1


@pytest.mark.parametrize("ctype", ["text/plain", "image/gif", "multipart/form-data"])
def test_unsupported_content_type_is_415(ctype: str) -> None:
    with pytest.raises(UnsupportedMediaType) as info:
        make_model().decode(encode_image("PNG"), ctype, {})
    assert info.value.status_code == 415
    assert ctype in info.value.message


def test_unknown_model_is_404() -> None:
    body = json.dumps({"model": "other-model", "input": b64(encode_image("PNG"))}).encode()
    with pytest.raises(NotFound) as info:
        make_model().decode(body, "application/json", {})
    assert info.value.status_code == 404
    assert "other-model" in info.value.message


def test_model_name_defaults_to_arch_and_is_accepted() -> None:
    body = json.dumps({"model": "resnet18", "input": b64(encode_image("PNG"))}).encode()
    assert len(make_model().decode(body, "application/json", {}).items) == 1


def test_too_many_inputs_is_400() -> None:
    body = json.dumps({"input": [b64(encode_image("PNG"))] * 3}).encode()
    with pytest.raises(BadRequest, match="max_inputs_per_request"):
        make_model(max_inputs_per_request=2).decode(body, "application/json", {})


# ---- preprocessing --------------------------------------------------------------------------


def model_input(item: np.ndarray) -> np.ndarray:
    """One preprocessed item as the model sees it: CHW float32, normalised."""
    batch = to_model_input(torch.from_numpy(np.stack([item])), torch.device("cpu"), torch.float32)
    return batch[0].numpy()


def test_preprocess_shape_and_normalisation() -> None:
    color = (255, 0, 128)
    adapter = make_model(image_size=48)
    (item,) = adapter.decode(encode_image("PNG", size=(90, 70), color=color), "image/png", {}).items
    assert item.shape == (48, 48, 3) and item.dtype == np.uint8
    arr = model_input(item)
    assert arr.shape == (3, 48, 48)
    expected = (np.array(color, dtype=np.float32) / 255.0 - MEAN) / STD
    for c in range(3):
        # a uniform lossless image stays uniform through resize and crop; float32 rounding only
        np.testing.assert_allclose(arr[c], expected[c], atol=1e-5)


def test_preprocess_centre_crop_of_a_wide_image() -> None:
    # 448 x 224, left half black, right half white: the centred crop keeps both halves.
    img = Image.new("RGB", (448, 224), (0, 0, 0))
    img.paste((255, 255, 255), (224, 0, 448, 224))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    (item,) = make_model(image_size=224).decode(buf.getvalue(), "image/png", {}).items
    arr = model_input(item)
    black, white = -MEAN / STD, (1 - MEAN) / STD
    np.testing.assert_allclose(arr[:, :, 0], np.repeat(black[:, None], 224, 1), atol=1e-5)
    np.testing.assert_allclose(arr[:, :, -1], np.repeat(white[:, None], 224, 1), atol=1e-5)
    # the black/white edge lies at the crop's centre column, +-1 pixel for bilinear blending
    edge = int(np.argmax(arr[0, 112] > 0))
    assert 111 <= edge <= 113, edge


def test_preprocess_of_an_extreme_aspect_ratio_stays_small() -> None:
    # 4 x 20,000: resizing the whole strip first would make it 146 x 731,429 pixels.
    adapter = make_model(image_size=32)
    (arr,) = adapter.decode(encode_image("PNG", size=(4, 20_000)), "image/png", {}).items
    assert arr.shape == (32, 32, 3)


def test_preprocess_grayscale_and_rgba_png() -> None:
    adapter = make_model()
    for mode, color in (("L", 128), ("RGBA", (10, 20, 30, 40))):
        buf = io.BytesIO()
        Image.new(mode, (40, 40), color).save(buf, format="PNG")
        (arr,) = adapter.decode(buf.getvalue(), "image/png", {}).items
        assert arr.shape == (32, 32, 3)


def test_worst_case_items_match_preprocessed_shape() -> None:
    items = make_model(image_size=40).backend.worst_case_items(3)
    assert len(items) == 3 and all(x.shape == (40, 40, 3) for x in items)


# ---- architecture and weights ---------------------------------------------------------------


def test_builtin_resnet50_uses_torchvision_names_and_shapes() -> None:
    state = build_resnet("resnet50").state_dict()
    expected = {
        "conv1.weight": (64, 3, 7, 7),
        "bn1.running_mean": (64,),
        "layer1.0.downsample.0.weight": (256, 64, 1, 1),
        "layer1.0.downsample.1.num_batches_tracked": (),
        "layer2.0.conv2.weight": (128, 128, 3, 3),
        "layer3.5.bn3.weight": (1024,),
        "layer4.2.conv2.weight": (512, 512, 3, 3),
        "layer4.2.bn3.running_var": (2048,),
        "fc.weight": (1000, 2048),
        "fc.bias": (1000,),
    }
    for key, shape in expected.items():
        assert key in state, key
        assert tuple(state[key].shape) == shape, (key, tuple(state[key].shape))
    # torchvision's resnet50: 320 state-dict entries, 25,557,032 parameters, stride in the 3x3
    assert len(state) == 320
    model = build_resnet("resnet50")
    assert sum(p.numel() for p in model.parameters()) == 25_557_032
    assert model.layer2[0].conv2.stride == (2, 2)
    assert model.layer2[0].conv1.stride == (1, 1)


def test_builtin_resnet18_parameter_count() -> None:
    assert sum(p.numel() for p in build_resnet("resnet18").parameters()) == 11_689_512


# ---- parity with torchvision ----------------------------------------------------------------
# torchvision does not import beside the pinned CPU torch, so everywhere the built-in ResNet is
# compared with logits torchvision computed on another host (tests/fixtures/resnet_golden.py), and
# where torchvision imports (the GPU host) with the live models too. Both sides get the same
# weights and input from tests/fixtures/resnet_fill.py.

GOLDEN_PATH = Path(resnet_fill.__file__).with_name("resnet_golden.json")
GOLDEN_COMMAND = "python3 -m tests.fixtures.resnet_golden --out tests/fixtures/resnet_golden.json"
# Of the largest |logit| (7 for resnet18, 14 for resnet50 under the fill): other torch versions
# and CPUs pick other float32 kernels, which here (oneDNN or not, channels-last or not, against
# float64) differ by under 1e-6 of it; a misplaced stride or padding moves logits by 1.5 to 3.
LOGIT_TOLERANCE = 1e-4


def resnet_golden() -> dict[str, Any]:
    if not GOLDEN_PATH.is_file():
        pytest.fail(
            f"{GOLDEN_PATH} is missing: write it where torchvision imports, from the repository "
            f"root, with `{GOLDEN_COMMAND}`, and commit it",
            pytrace=False,
        )
    golden: dict[str, Any] = json.loads(GOLDEN_PATH.read_text())
    return golden


def assert_logits_match(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape == (resnet_fill.INPUT_SHAPE[0], 1000)
    atol = LOGIT_TOLERANCE * float(theirs.abs().max())
    torch.testing.assert_close(ours, theirs, rtol=0.0, atol=atol)


def test_resnet_golden_was_written_by_torchvision() -> None:
    golden = resnet_golden()
    assert golden["source"] == SOURCE_TORCHVISION and golden["torchvision"], (
        f"{GOLDEN_PATH} records {golden['source']!r}, not torchvision: regenerate it with "
        f"`{GOLDEN_COMMAND}` where torchvision imports"
    )


@pytest.mark.parametrize("arch", GOLDEN_ARCHS)
def test_builtin_matches_torchvision_golden(arch: str) -> None:
    golden = resnet_golden()
    assert golden["fill_rule"] == resnet_fill.FILL_RULE, f"regenerate with `{GOLDEN_COMMAND}`"
    assert golden["input"]["sha256"] == resnet_fill.input_digest(), "the input, not the model"
    recorded = golden["archs"][arch]
    model = build_resnet(arch)
    state = resnet_fill.fill_state(model)
    assert resnet_fill.state_signature(model) == recorded["state"]
    assert resnet_fill.fill_digest(state) == recorded["fill_sha256"], "the fill, not the model"
    assert_logits_match(resnet_fill.logits_of(model), resnet_fill.decode_logits(recorded["logits"]))


@pytest.mark.parametrize("arch", GOLDEN_ARCHS)
def test_builtin_matches_live_torchvision(arch: str) -> None:
    tv = pytest.importorskip("torchvision")
    ours, theirs = build_resnet(arch), tv.models.get_model(arch, weights=None)
    assert resnet_fill.state_signature(ours) == resnet_fill.state_signature(theirs)
    resnet_fill.fill_state(ours)
    resnet_fill.fill_state(theirs)
    assert_logits_match(resnet_fill.logits_of(ours), resnet_fill.logits_of(theirs))


def test_unknown_arch_without_torchvision_is_config_error() -> None:
    with pytest.raises(ConfigError, match="args.arch"):
        build_model("vit_b_16")


def _random_state(arch: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(1234)
    model = build_resnet(arch)
    state = model.state_dict()
    for key, value in state.items():
        if key.endswith("running_mean"):
            value.copy_(torch.randn_like(value) * 0.1)
        elif key.endswith("running_var"):
            value.copy_(torch.rand_like(value) + 0.5)
    return state


@pytest.fixture(scope="module")
def weight_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from safetensors.torch import save_file

    state = _random_state("resnet18")
    root = tmp_path_factory.mktemp("weights")
    st_path, pt_path, wrapped = root / "r18.safetensors", root / "r18.pt", root / "r18.pth"
    save_file({k: v.contiguous() for k, v in state.items()}, str(st_path))
    torch.save(state, str(pt_path))
    torch.save({"state_dict": state, "epoch": 3}, str(wrapped))
    return {"safetensors": st_path, "pt": pt_path, "wrapped": wrapped}


def _loaded(path: Path, **args: Any) -> Model:
    adapter = make_model(load_format="auto", model_path=str(path), **args)
    adapter.backend.setup(CPU)
    return adapter


def test_safetensors_and_torch_save_give_identical_logits(weight_files: dict[str, Path]) -> None:
    adapters = [_loaded(weight_files[k]) for k in ("safetensors", "pt", "wrapped")]
    torch.manual_seed(0)
    batch = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        logits = [a.backend.model(batch) for a in adapters]  # type: ignore[misc]
    assert torch.equal(logits[0], logits[1])
    assert torch.equal(logits[0], logits[2])
    # and the weights are really the file's, not a fresh random init
    expected = _random_state("resnet18")["fc.bias"]
    assert torch.equal(adapters[0].backend.model.state_dict()["fc.bias"], expected)  # type: ignore[union-attr]


def test_mismatching_state_dict_is_config_error(weight_files: dict[str, Path]) -> None:
    adapter = make_model(load_format="auto", model_path=str(weight_files["safetensors"]))
    adapter.backend.args.arch = "resnet34"  # resnet18 weights into a resnet34
    with pytest.raises(ConfigError) as info:
        adapter.backend.setup(CPU)
    assert "args.model_path" in info.value.message
    assert "resnet34" in info.value.message


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_unreadable_weights_file_is_config_error(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"garbage{suffix}"
    path.write_bytes(b"\x00not weights" * 10)
    adapter = make_model(load_format="auto", model_path=str(path))
    with pytest.raises(ConfigError, match="args.model_path"):
        adapter.backend.setup(CPU)


def test_weights_file_without_a_state_dict_is_config_error(tmp_path: Path) -> None:
    path = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), str(path))
    with pytest.raises(ConfigError, match="not a state dict"):
        _loaded(path)


def test_model_path_required_unless_dummy(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model_path"):
        make_model(load_format="auto")
    with pytest.raises(ConfigError, match="model_path"):
        make_model(load_format="auto", model_path=str(tmp_path / "missing.safetensors"))
    with pytest.raises(ConfigError, match="labels_path"):
        make_model(labels_path=str(tmp_path / "missing.txt"))


def test_dummy_works_without_model_path(ready_adapter: Model) -> None:
    assert ready_adapter.backend.args.model_path is None
    assert ready_adapter.backend.model is not None
    assert ready_adapter.backend.describe()["load_format"] == "dummy"


# ---- predict and encode ---------------------------------------------------------------------


def test_predict_returns_probabilities(ready_adapter: Model) -> None:
    blobs = [encode_image("PNG", color=(i * 60, 20, 200 - i * 50)) for i in range(3)]
    items = [ready_adapter.decode(b, "image/png", {}).items[0] for b in blobs]
    outputs = ready_adapter.backend.predict(items)
    assert len(outputs) == 3
    for scores, ids in outputs:
        assert scores.shape == (1000,) and ids.shape == (1000,)
        assert abs(float(scores.sum()) - 1.0) < 1e-4  # softmax in float32
        assert np.all(np.diff(scores) <= 0)  # sorted, best first
        assert sorted(ids.tolist()) == list(range(1000))


def test_encode_top_k_and_labels(tmp_path: Path, weight_files: dict[str, Path]) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"label-{i}\n" for i in range(1000)))
    adapter = _loaded(weight_files["safetensors"], labels_path=str(labels), top_k=3)
    body = json.dumps({"input": [b64(encode_image("PNG"))] * 2, "top_k": 4}).encode()
    decoded = adapter.decode(body, "application/json", {})
    out = adapter.encode(adapter.backend.predict(decoded.items), decoded)
    assert out["object"] == "list" and out["model"] == "resnet18"
    assert [d["index"] for d in out["data"]] == [0, 1]
    for entry in out["data"]:
        top = entry["top_k"]
        assert len(top) == 4
        assert all(t["label"] == f"label-{t['class_id']}" for t in top)
        scores = [t["score"] for t in top]
        assert scores == sorted(scores, reverse=True)
    # without labels: class_<id>
    plain = make_model(top_k=2)
    plain.backend.setup(CPU)
    d = plain.decode(encode_image("PNG"), "image/png", {})
    (entry,) = plain.encode(plain.backend.predict(d.items), d)["data"]
    assert len(entry["top_k"]) == 2
    assert entry["top_k"][0]["label"] == f"class_{entry['top_k'][0]['class_id']}"


# ---- the request's pixel budget and JPEG drafts (issue 25, finding 4) -------------------------


def test_128_huge_greyscale_pngs_are_refused_from_their_headers_fast() -> None:
    # The request of issue 25: 128 greyscale 6324 x 6324 PNGs, each just under
    # max_image_pixels and a few tens of KB, took 21 s of CPU to decode.
    buf = io.BytesIO()
    Image.new("L", (6324, 6324), 0).save(buf, format="PNG", optimize=True)
    png = buf.getvalue()
    assert len(png) < 64 * 1024
    adapter = make_model()  # the defaults: 40,000,000 a picture, 100,000,000 a request
    body = json.dumps({"input": [b64(png)] * 128}).encode()
    started = time.process_time()
    with pytest.raises(PayloadTooLarge) as info:
        adapter.decode(body, "application/json", {})
    took_s = time.process_time() - started
    err = info.value
    assert (err.status_code, err.code, err.param) == (413, "request_pixels_exceeded", "input")
    assert "args.max_request_pixels" in err.message and str(128 * 6324 * 6324) in err.message
    assert took_s < 0.5, took_s  # headers only: decoding them would take seconds each


def test_a_request_at_its_pixel_budget_is_decoded() -> None:
    adapter = make_model(max_image_pixels=10_000, max_request_pixels=20_000)
    blobs = [encode_image("PNG", size=(100, 100))] * 2
    assert (
        len(adapter.decode(json.dumps({"input": [b64(b) for b in blobs]}).encode(), "", {}).items)
        == 2
    )
    with pytest.raises(PayloadTooLarge, match="max_request_pixels"):
        adapter.decode(json.dumps({"input": [b64(b) for b in blobs * 2]}).encode(), "", {})


def test_the_pixel_budget_must_hold_one_largest_image() -> None:
    with pytest.raises(ConfigError, match="max_request_pixels"):
        parse_args(
            {
                "adapter": "image-classification",
                "max_image_pixels": 50_000_000,
                "max_request_pixels": 40_000_000,
            }
        )


def _photo_jpeg(size: tuple[int, int]) -> bytes:
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rgb = np.stack([127 + 100 * np.sin(x / 40), 127 + 100 * np.cos(y / 30), 255 * x / w], -1)
    buf = io.BytesIO()
    Image.fromarray(rgb.astype(np.uint8)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def test_a_large_jpeg_decodes_at_the_reduced_size_the_crop_needs() -> None:
    blob = _photo_jpeg((2400, 1800))  # 4.3 MP; the crop at 224 needs a short side of 256
    (header,) = read_headers([blob], 224, 40_000_000, 100_000_000, gpu_path=False)
    assert header.image.size == (2400 // 4, 1800 // 4) and header.pixels == 600 * 450
    drafted = pillow_crop(blob, 0, 224, 40_000_000)
    full = crop_opened(open_header(blob, "input[0]", 40_000_000), "input[0]", 224, 40_000_000)
    assert drafted.shape == full.shape == (224, 224, 3)
    diff = np.abs(drafted.astype(np.int16) - full.astype(np.int16))
    assert diff.mean() < 2.0, diff.mean()  # the same picture, from a sixteenth of the pixels
    # a JPEG near the crop's size, and every PNG, decode whole
    (small,) = read_headers([_photo_jpeg((500, 375))], 224, 40_000_000, 100_000_000, False)
    (png,) = read_headers([encode_image("PNG", (2400, 1800))], 224, 40_000_000, 10**8, False)
    assert (small.image.size, png.image.size) == ((500, 375), (2400, 1800))


def test_the_gpu_path_counts_nvjpegs_jpegs_at_full_size() -> None:
    blob = _photo_jpeg((2400, 1800))
    (header,) = read_headers([blob], 224, 40_000_000, 100_000_000, gpu_path=True)
    assert header.gpu and header.pixels == 2400 * 1800
