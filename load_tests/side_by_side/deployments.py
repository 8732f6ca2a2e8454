"""Plain Ray Serve deployments written as Ray's docs show them, and the no-op app."""

from __future__ import annotations

import asyncio
from typing import Any


def preprocess_image(blob: bytes, size: int = 224) -> Any:
    """JPEG/PNG bytes -> normalised CHW float32, the same steps as serve_app's image adapter:
    RGB, the centre square that becomes a size x size crop after resizing the short side to
    size*256/224, resized in one bilinear step, then ImageNet mean/std."""
    import io

    import numpy as np
    from PIL import Image

    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32)
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32)
    img = Image.open(io.BytesIO(blob)).convert("RGB")
    scale = size * 256 / 224 / min(img.size)
    side = size / scale
    left, top = (img.width - side) / 2, (img.height - side) / 2
    img = img.resize(
        (size, size), Image.Resampling.BILINEAR, box=(left, top, left + side, top + side)
    )
    arr = (np.asarray(img, dtype=np.float32) / 255.0 - mean) / std
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


def build_resnet50() -> Any:
    """torchvision's ResNet-50 with random weights (serve_app's copy where torchvision is
    missing, as on the CPU test machine; same module layout)."""
    try:
        import torchvision

        return torchvision.models.resnet50(weights=None)
    except Exception:  # noqa: BLE001 - no or broken torchvision
        from serve_app.adapters.image.resnet import build_resnet

        return build_resnet("resnet50")


def minilm_dir() -> str:
    from serve_app.adapters.embeddings.adapter import SKELETON_DIR

    return str(SKELETON_DIR)


def plain_image_deployment(max_batch_size: int, batch_wait_timeout_s: float) -> Any:
    """ResNet-50 as Ray's docs write a batched model: decode in __call__, @serve.batch around
    the forward pass, fp16 channels-last on the GPU."""
    from ray import serve
    from starlette.requests import Request

    class PlainImageClassifier:
        def __init__(self) -> None:
            import torch

            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
            model = build_resnet50().to(self.device, self.dtype).eval()
            if self.device.type == "cuda":
                model = model.to(memory_format=torch.channels_last)
            self.model = model

        async def __call__(self, request: Request) -> dict[str, Any]:
            import base64

            body = await request.json()
            blobs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            images = [preprocess_image(base64.b64decode(b)) for b in blobs]
            outs = await asyncio.gather(*(self.classify(im) for im in images))
            data = [
                {
                    "index": n,
                    "top_k": [
                        {"class_id": int(c), "score": float(s)}
                        for s, c in zip(scores, ids, strict=True)
                    ],
                }
                for n, (scores, ids) in enumerate(outs)
            ]
            return {"object": "list", "model": body.get("model"), "data": data}

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)
        async def classify(self, images: list[Any]) -> list[Any]:
            import numpy as np
            import torch

            batch = torch.from_numpy(np.stack(images)).to(self.device)
            if self.device.type == "cuda":
                batch = batch.to(dtype=self.dtype, memory_format=torch.channels_last)
            with torch.inference_mode():
                probs = torch.softmax(self.model(batch).float(), dim=1)
                scores, ids = probs.topk(5, dim=1)
            s, i = scores.cpu().numpy(), ids.cpu().numpy()
            return [(s[k], i[k]) for k in range(len(images))]

    return serve.deployment(PlainImageClassifier)


def plain_embeddings_deployment(max_batch_size: int, batch_wait_timeout_s: float) -> Any:
    """MiniLM (random weights from the skeleton config) as Ray's docs write a batched model:
    tokenize in __call__, @serve.batch around pad + forward + mean pooling + L2 norm."""
    from ray import serve
    from starlette.requests import Request

    model_dir = minilm_dir()

    class PlainEmbedder:
        def __init__(self) -> None:
            import torch
            from transformers import AutoConfig, AutoModel, AutoTokenizer

            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            dtype = torch.float16 if self.device.type == "cuda" else torch.float32
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
            model = AutoModel.from_config(AutoConfig.from_pretrained(model_dir))
            self.model = model.to(self.device, dtype).eval()
            self.pad_id = int(self.tokenizer.pad_token_id or 0)

        async def __call__(self, request: Request) -> dict[str, Any]:

            body = await request.json()
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            ids = self.tokenizer(texts, truncation=True, max_length=256)["input_ids"]
            vecs = await asyncio.gather(*(self.embed(x) for x in ids))
            data = [{"object": "embedding", "index": n, "embedding": v} for n, v in enumerate(vecs)]
            return {"object": "list", "model": body.get("model"), "data": data}

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)
        async def embed(self, batch_ids: list[list[int]]) -> list[list[float]]:
            import torch

            longest = max(len(x) for x in batch_ids)
            ids = torch.full((len(batch_ids), longest), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch_ids), longest), dtype=torch.long)
            for row, seq in enumerate(batch_ids):
                ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
                mask[row, : len(seq)] = 1
            ids, mask = ids.to(self.device), mask.to(self.device)
            with torch.inference_mode():
                hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
                m = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled.float(), p=2, dim=1)
            return pooled.cpu().numpy().tolist()

    return serve.deployment(PlainEmbedder)


def noop_deployment() -> Any:
    """A FastAPI-ingress deployment whose one route does nothing (serve_app's ingress shape)."""
    from fastapi import FastAPI
    from ray import serve

    api = FastAPI()

    @serve.ingress(api)
    class Noop:
        @api.post("/noop")
        async def noop(self) -> dict[str, bool]:
            return {"ok": True}

    return serve.deployment(Noop)


def create_noop_app() -> Any:
    """The bare uvicorn + Starlette no-op server used to measure the client's own ceiling."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def noop(request: Request) -> JSONResponse:
        await request.body()
        return JSONResponse({"ok": True})

    return Starlette(routes=[Route("/{path:path}", noop, methods=["GET", "POST"])])


def noop_request(url: str) -> Any:
    from load_tests import bench

    return bench.PreparedRequest("POST", url, {"Content-Type": "application/json"}, b"{}")
