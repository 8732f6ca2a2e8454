"""What both peer servers run for MiniLM, written as a user of each framework would: the request
parse, the model (the same HF tokenizer and BERT-6x384 that serve_app serves in this benchmark:
the all-MiniLM-L6-v2 config with dummy random weights, fp16 on a GPU, fp32 on the CPU; mean
pooling and L2 norm as sentence-transformers does), and an OpenAI-shaped answer as a dict that
the framework turns into JSON its own way.

The peers: ``ray_serve_batch_app`` (plain Ray Serve, ``@serve.batch``) and ``litserve_app``
(LitServe 0.2.19); each loads the model here and serves it on its own path.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# all-MiniLM-L6-v2's max_seq_length in sentence-transformers (longer texts are cut there).
MAX_LENGTH_TOKENS = 256
ENCODINGS = ("float", "base64")
MODEL_NAME = "all-MiniLM-L6-v2"


class RequestError(ValueError):
    """A request the peer answers with HTTP 400 and this message."""


def parse_request(doc: Any) -> tuple[list[str], str]:
    """``{"input": str | [str, ...], "encoding_format"?: "float" | "base64"}`` -> (texts,
    encoding format), or RequestError naming the field."""
    if not isinstance(doc, Mapping):
        raise RequestError("the body must be a JSON object with an 'input' field")
    value = doc.get("input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise RequestError("'input' must be a string or a non-empty list of strings")
    fmt = doc.get("encoding_format") or "float"
    if fmt not in ENCODINGS:
        raise RequestError(f"'encoding_format' must be one of {list(ENCODINGS)}, not {fmt!r}")
    return texts, str(fmt)


def response_doc(vectors: np.ndarray, fmt: str, model: str, tokens: int) -> dict[str, Any]:
    """The OpenAI embeddings answer for ``vectors`` (one row per text): float lists, or base64
    of the little-endian float32 bytes."""
    data = []
    for i, vec in enumerate(vectors):
        emb: Any
        if fmt == "base64":
            emb = base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")
        else:
            emb = vec.tolist()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def split(items: Any, counts: Sequence[int]) -> list[Any]:
    """``items`` cut into consecutive pieces of ``counts`` (one per request of a batch)."""
    out, start = [], 0
    for n in counts:
        out.append(items[start : start + n])
        start += n
    if start != len(items):
        raise ValueError(f"{len(items)} items for counts summing to {start}")
    return out


class Embedder:
    """The tokenizer and model on ``device`` ("cuda", "cuda:0" or "cpu")."""

    def __init__(self, device: str) -> None:
        import torch
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        from load_tests.benchmarks.throughput.ceiling import minilm_dir

        self.torch = torch
        self.device = torch.device(device)
        dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
        model = AutoModel.from_config(AutoConfig.from_pretrained(minilm_dir()))
        self.model = model.to(self.device, dtype).eval()

    def embed(self, texts: Sequence[str]) -> tuple[np.ndarray, list[int]]:
        """Unit float32 vectors of ``texts`` (one batch, padded to its longest) and each text's
        token count."""
        torch = self.torch
        enc = self.tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=MAX_LENGTH_TOKENS,
            return_tensors="pt",
        )
        mask = enc["attention_mask"]
        tokens = mask.sum(1).tolist()
        with torch.inference_mode():
            enc = enc.to(self.device)
            hidden = self.model(**enc).last_hidden_state
            m = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
            vectors = torch.nn.functional.normalize(pooled.float(), p=2, dim=1)
        return vectors.cpu().numpy(), [int(t) for t in tokens]
