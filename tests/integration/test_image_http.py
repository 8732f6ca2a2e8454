"""Image classification over real HTTP: a resnet18 replica on the session's Ray cluster (CPU).

Weights come from a safetensors file written here, labels from a text file; the app lives at
``/img`` and is deleted at the end of the module.
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from serve_app.adapters.image.resnet import build_resnet

APP = "image-http"
PREFIX = "/img"
TOP_K = 3
# Room for 128 greyscale PNGs of 6324 x 6324 (about 40 KB each, 6.6 MB in base64 JSON).
MAX_BODY_BYTES = 7_000_000
# One body of MAX_BODY_BYTES and one of 4 MB pass it together.
MAX_BODY_BYTES_IN_FLIGHT = 10_000_000


def encode_image(fmt: str, color: tuple[int, int, int], size: tuple[int, int] = (80, 60)) -> bytes:
    img = Image.new("RGB", size, color)
    img.paste((255 - color[0], 255 - color[1], 255 - color[2]), (0, 0, size[0] // 2, size[1]))
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def image_app(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("image-app")
    torch.manual_seed(7)
    state = build_resnet("resnet18").state_dict()
    weights = root / "resnet18.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(weights))
    labels = [f"thing-{i}" for i in range(1000)]
    labels_path = root / "labels.txt"
    labels_path.write_text("\n".join(labels) + "\n")
    args = {
        "adapter": "image-classification",
        "arch": "resnet18",
        "model_path": str(weights),
        "labels_path": str(labels_path),
        "image_size": 64,
        "top_k": TOP_K,
        "max_body_bytes": MAX_BODY_BYTES,
        "max_body_bytes_in_flight": MAX_BODY_BYTES_IN_FLIGHT,
        "max_batch_size": 8,
    }
    base = cluster.deploy(APP, PREFIX, args, ray_actor_options={"num_cpus": 0.5})
    try:
        yield {"base": base, "labels": set(labels)}
    finally:
        cluster.delete(APP)


def classify(base: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{base}/v1/classify", timeout=60.0, **kwargs)


def assert_json_error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, (resp.status_code, resp.text[:500])
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body = resp.json()
    assert set(body["error"]) == {"message", "type", "param", "code", "request_id"}, body
    assert body["error"]["request_id"] == resp.headers["x-request-id"]
    assert "Traceback" not in body["error"]["message"]
    return dict(body["error"])


def test_raw_jpeg_gets_top_k_labels(image_app: dict[str, Any]) -> None:
    resp = classify(
        image_app["base"],
        content=encode_image("JPEG", (200, 40, 40)),
        headers={"content-type": "image/jpeg"},
    )
    assert resp.status_code == 200, resp.text[:500]
    body = resp.json()
    assert body["object"] == "list" and body["model"] == "resnet18"
    (entry,) = body["data"]
    top = entry["top_k"]
    assert len(top) == TOP_K
    assert all(t["label"] in image_app["labels"] for t in top), top
    assert all(t["label"] == f"thing-{t['class_id']}" for t in top), top
    assert [t["score"] for t in top] == sorted((t["score"] for t in top), reverse=True)


def test_raw_png_with_top_k_query(image_app: dict[str, Any]) -> None:
    resp = classify(
        image_app["base"],
        content=encode_image("PNG", (10, 200, 90)),
        headers={"content-type": "image/png"},
        params={"top_k": 5},
    )
    assert resp.status_code == 200, resp.text[:500]
    assert len(resp.json()["data"][0]["top_k"]) == 5


def test_json_base64_list_keeps_order(image_app: dict[str, Any]) -> None:
    blobs = [
        encode_image("JPEG", (250, 10, 10)),
        encode_image("PNG", (10, 250, 10)),
        encode_image("PNG", (10, 10, 250), size=(120, 40)),
    ]
    inputs = [base64.b64encode(b).decode() for b in blobs]
    resp = classify(image_app["base"], json={"input": inputs, "model": "resnet18"})
    assert resp.status_code == 200, resp.text[:500]
    data = resp.json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2]
    # each result is the one its image gets alone (same weights, eval mode; float tolerance
    # for a different batch composition)
    for i, blob in enumerate(blobs):
        alone = classify(image_app["base"], json={"input": inputs[i]})
        assert alone.status_code == 200, alone.text[:500]
        (single,) = alone.json()["data"]
        assert data[i]["top_k"][0]["class_id"] == single["top_k"][0]["class_id"], (i, blob[:4])
        assert abs(data[i]["top_k"][0]["score"] - single["top_k"][0]["score"]) < 1e-4


def test_bad_image_is_400_json(image_app: dict[str, Any]) -> None:
    resp = classify(
        image_app["base"], content=b"definitely not a jpeg", headers={"content-type": "image/jpeg"}
    )
    err = assert_json_error(resp, 400)
    assert err["param"] == "input[0]"
    resp = classify(image_app["base"], json={"input": ["%%% not base64"]})
    assert assert_json_error(resp, 400)["param"] == "input[0]"


def test_gif_is_400_json(image_app: dict[str, Any]) -> None:
    buf = io.BytesIO()
    Image.new("P", (20, 20), 1).save(buf, format="GIF")
    resp = classify(
        image_app["base"], content=buf.getvalue(), headers={"content-type": "image/png"}
    )
    assert "GIF" in assert_json_error(resp, 400)["message"]


def test_oversized_body_is_413_json(image_app: dict[str, Any]) -> None:
    body = os.urandom(MAX_BODY_BYTES + 50_000)
    resp = classify(image_app["base"], content=body, headers={"content-type": "image/png"})
    err = assert_json_error(resp, 413)
    assert "max_body_bytes" in err["message"]


def test_oversized_chunked_body_is_413_json(image_app: dict[str, Any]) -> None:
    # No Content-Length: the limit applies while the body streams in.
    def chunks() -> Iterator[bytes]:
        for _ in range(MAX_BODY_BYTES // 600_000 + 2):
            yield b"\x00" * 600_000

    resp = classify(image_app["base"], content=chunks(), headers={"content-type": "image/png"})
    assert_json_error(resp, 413)


def test_wrong_content_type_is_415_json(image_app: dict[str, Any]) -> None:
    resp = classify(image_app["base"], content=b"hello", headers={"content-type": "text/plain"})
    err = assert_json_error(resp, 415)
    assert "text/plain" in err["message"]


def test_unknown_model_is_404_json(image_app: dict[str, Any]) -> None:
    inp = base64.b64encode(encode_image("PNG", (1, 2, 3))).decode()
    resp = classify(image_app["base"], json={"input": inp, "model": "resnet9000"})
    assert assert_json_error(resp, 404)["code"] == "model_not_found"


def test_weights_file_is_used(image_app: dict[str, Any], tmp_path: Path) -> None:
    # The served scores equal the in-process model's with the same seeded weights.
    from serve_app.adapters.image import build
    from serve_app.config.args import parse_args

    torch.manual_seed(7)
    state = build_resnet("resnet18").state_dict()
    path = tmp_path / "w.pt"
    torch.save(state, str(path))
    model = build(
        parse_args(
            {
                "adapter": "image-classification",
                "arch": "resnet18",
                "model_path": str(path),
                "image_size": 64,
            }
        )
    )
    model.backend.setup(torch.device("cpu"))
    blob = encode_image("PNG", (30, 60, 90))
    decoded = model.decode(blob, "image/png", {})
    scores, ids = model.backend.predict(decoded.items)[0]
    resp = classify(image_app["base"], content=blob, headers={"content-type": "image/png"})
    assert resp.status_code == 200, resp.text[:500]
    top = resp.json()["data"][0]["top_k"]
    assert [t["class_id"] for t in top] == [int(i) for i in ids[:TOP_K]]
    assert all(abs(t["score"] - float(s)) < 1e-4 for t, s in zip(top, scores, strict=False))


def huge_grey_png() -> bytes:
    """6324 x 6324 greyscale, one value: about 40 KB, 39,992,976 pixels (just under the
    default args.max_image_pixels). Issue 25: 128 of them took 21 s of CPU to decode."""
    buf = io.BytesIO()
    Image.new("L", (6324, 6324), 0).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def test_128_huge_pngs_are_refused_fast_and_a_neighbour_is_served(
    image_app: dict[str, Any],
) -> None:
    base = image_app["base"]
    body = json.dumps({"input": [base64.b64encode(huge_grey_png()).decode()] * 128}).encode()
    assert len(body) < MAX_BODY_BYTES
    neighbour_body = {
        "input": [base64.b64encode(encode_image("JPEG", (i, 80, 200))).decode() for i in range(8)]
    }
    with ThreadPoolExecutor(1) as pool:
        neighbour = pool.submit(classify, base, json=neighbour_body)  # in flight meanwhile
        started = time.perf_counter()
        resp = classify(base, content=body, headers={"content-type": "application/json"})
        took_s = time.perf_counter() - started
        beside = neighbour.result()
    err = assert_json_error(resp, 413)
    assert err["code"] == "request_pixels_exceeded" and "args.max_request_pixels" in err["message"]
    # From the headers: decoding them took 21 s of CPU, so a refusal in a quarter of that read
    # no pixels (the bound leaves room for a suite run beside another on 2 cores).
    assert took_s < 5.0, took_s
    assert beside.status_code == 200, beside.text[:500]
    assert len(beside.json()["data"]) == 8


def test_body_bytes_in_flight_are_bounded_and_released(image_app: dict[str, Any]) -> None:
    base = image_app["base"]
    url = httpx.URL(f"{base}/v1/classify")
    noise = np.random.default_rng(0).integers(0, 256, (1200, 1200, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, format="PNG")
    four_mb = buf.getvalue()  # a real image of about 4.3 MB: it fits alone, not beside 7 MB
    assert MAX_BODY_BYTES + len(four_mb) > MAX_BODY_BYTES_IN_FLIGHT > len(four_mb)
    png = {"content-type": "image/png"}
    # A slow upload: its declared 7 MB are held from its headers on, while it sends no more
    # than its first 100 KB (more than the one buffer HAProxy holds before it forwards).
    slow = socket.create_connection((url.host, url.port))
    try:
        slow.sendall(
            f"POST {url.raw_path.decode()} HTTP/1.1\r\nHost: {url.host}\r\n"
            f"Content-Type: image/png\r\nContent-Length: {MAX_BODY_BYTES}\r\n\r\n".encode()
            + four_mb[:100_000]
        )
        deadline = time.monotonic() + 10.0
        while True:
            resp = classify(base, content=four_mb, headers=png)
            if resp.status_code == 503 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        err = assert_json_error(resp, 503)
        assert err["code"] == "body_bytes_in_flight", err
        assert "args.max_body_bytes_in_flight" in err["message"]
        assert int(resp.headers["retry-after"]) >= 1
        small = classify(base, content=encode_image("PNG", (5, 5, 5)), headers=png)
        assert small.status_code == 200, small.text[:300]  # small bodies still fit beside it
    finally:
        slow.close()  # a client that goes: its bytes are released with its request
    deadline = time.monotonic() + 10.0
    while (resp := classify(base, content=four_mb, headers=png)).status_code == 503:
        assert time.monotonic() < deadline, resp.text[:300]
        time.sleep(0.1)
    assert resp.status_code == 200, resp.text[:300]


def test_replica_healthy_after_bad_requests(image_app: dict[str, Any]) -> None:
    # runs last in this module (pytest keeps file order): every bad request above came first
    base = image_app["base"]
    assert httpx.get(f"{base}/healthz", timeout=10.0).status_code == 200
    resp = classify(
        base, content=encode_image("JPEG", (90, 90, 90)), headers={"content-type": "image/jpeg"}
    )
    assert resp.status_code == 200, resp.text[:500]
    assert len(resp.json()["data"][0]["top_k"]) == TOP_K
    models = httpx.get(f"{base}/v1/models", timeout=10.0).json()
    assert models["data"][0]["task"] == "image-classification"
