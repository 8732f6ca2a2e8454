"""The embeddings model backend: a BERT-family encoder (serve_app's own, or transformers'
AutoModel for what it does not run) with mean or CLS pooling. Requests are tokenized in
``prepare``, so that every input's token count is known before a batch; a batch carries token
ids, padded per batch (to a CUDA graph's length bucket when one is captured)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.nn.attention import sdpa_kernel

from serve_app import env
from serve_app.adapters.contract import load_state_dict, pow2_sizes, resolve_dtype
from serve_app.adapters.embeddings import bert
from serve_app.adapters.embeddings.modeldir import (
    TextItem,
    Tokenization,
    read_json,
    resolve_dir,
    run_tokenized,
    token_estimate,
)
from serve_app.config.args import AppArgs
from serve_app.errors import ConfigError
from serve_app.gpu.graphs import GraphMemory, GraphSet, graph_batch_sizes, text_batch_shape

logger = logging.getLogger("serve_app")

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


class HFEncoder(torch.nn.Module):
    """transformers' AutoModel called as serve_app's encoder is: (ids, mask) -> the last hidden
    state."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(bert.ATTENTION_BACKENDS):  # no cuDNN attention: see bert.py
            return self.inner(input_ids=ids, attention_mask=mask).last_hidden_state


class SentenceEncoder:
    """Sentence embeddings from a sentence-transformers model directory."""

    # prepare only checks characters (tokenizing is the batch's): cheap on the event loop.
    prepare_inline = True

    def __init__(self, args: AppArgs):
        self.args = args
        self.model_dir = resolve_dir(args)
        pool_cfg = read_json(self.model_dir / "1_Pooling" / "config.json")
        self.pooling = "cls" if pool_cfg.get("pooling_mode_cls_token") else "mean"
        self.tokens = Tokenization(self.model_dir, args)
        self.max_tokens = self.tokens.max_tokens
        self.model: torch.nn.Module | None = None
        self.device = torch.device("cpu")
        self.dim = 0
        self.max_positions = self.max_tokens
        self.encoder = ""  # which implementation runs the model: "serve_app" or "transformers"
        self.setup_phases_s: dict[str, float] | None = None
        self.graphs: GraphSet | None = None
        self._graph_sizes: list[int] = []
        self._graph_lengths: list[int] = []

    def setup(self, device: torch.device) -> None:
        env.models_offline()
        t0 = time.perf_counter()
        dtype = resolve_dtype(self.args, device)
        config = read_json(self.model_dir / "config.json")
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
            enc, t2 = self._build_bert(config, device, dtype)
            t1 = t0  # nothing to import
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
        self.setup_phases_s = {
            "import": round(t1 - t0, 3),
            "build": round(t2 - t1, 3),
            "to_device": round(time.perf_counter() - t2, 3),
        }
        self.device = device

    def _build_bert(
        self, config: dict[str, Any], device: torch.device, dtype: torch.dtype
    ) -> tuple[bert.BertEncoder, float]:
        """serve_app's BERT encoder: random weights made on the device itself (dummy), or the
        checkpoint's tensors taken as they are, then moved. Returns it with the clock at the end
        of the build."""
        cfg = bert.BertConfig.from_dict(config)
        if self.args.load_format == "dummy":
            with torch.device(device):
                model = bert.BertEncoder(cfg)
            model.init_random()
            t2 = time.perf_counter()
            return model.to(dtype=dtype), t2
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
        return model.to(device=device, dtype=dtype), t2

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

    def prepare(self, inputs: Sequence[Any]) -> list[TextItem]:
        """Each text as a batch item (tokenized with its batch); BadRequest for one over the
        character bound, an ItemError from the batch for one over ``max_tokens``."""
        return self.tokens.items(list(inputs))

    def token_cost(self, item: Any) -> int:
        """What the batcher packs by: the item's tokens, estimated until the batch tokenizes it
        (serve_app.startup.calibration.length_packing)."""
        return token_estimate(item)

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
        self, max_batch_size: int, budget_s: float | None, memory: GraphMemory
    ) -> GraphSet:
        """CUDA graphs of the forward pass for each batch bucket up to ``max_batch_size`` and
        each of GRAPH_LENGTHS within the model's limit (for at most ``budget_s``: see
        ``GraphSet.capture_all``)."""
        lengths = [n for n in GRAPH_LENGTHS if n <= min(self.max_tokens, self.max_positions)]
        sizes = graph_batch_sizes(max_batch_size)
        graphs = GraphSet(self._forward, memory)
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

    def predict(self, items: Sequence[TextItem | list[int]]) -> list[Any]:
        """Each item's vector, the batch tokenized in one call here, in the model's thread (an
        ItemError for an item over ``max_tokens``)."""
        return run_tokenized(items, self.tokens, self._predict_ids)

    def _predict_ids(self, batch: list[TextItem]) -> list[np.ndarray]:
        assert self.model is not None, "setup() must run before predict()"
        items = [it.ids or [] for it in batch]
        graph, longest = text_batch_shape(
            self.graphs,
            self._graph_sizes,
            self._graph_lengths,
            len(items),
            max(len(ids) for ids in items),
            self.max_positions,
            PAD_MULTIPLE,
        )
        ids_np = np.full((len(items), longest), self.tokens.pad_id, dtype=np.int64)
        mask_np = np.zeros((len(items), longest), dtype=np.int64)
        for row, seq in enumerate(items):
            ids_np[row, : len(seq)] = seq
            mask_np[row, : len(seq)] = 1
        ids, mask = torch.from_numpy(ids_np), torch.from_numpy(mask_np)
        with torch.inference_mode():
            if graph is not None:
                assert self.graphs is not None
                (pooled,) = self.graphs.run(graph, (ids, mask))
            else:
                (pooled,) = self._forward(ids.to(self.device), mask.to(self.device))
            out = pooled.cpu().numpy()
        return [out[i] for i in range(len(items))]

    def worst_case_items(self, n: int) -> list[list[int]]:
        body = [1000] * (self.max_tokens - 2)
        return [[self.tokens.cls_id, *body, self.tokens.sep_id] for _ in range(n)]

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

    def report(self) -> dict[str, Any]:
        return {"weights_phases_s": self.setup_phases_s, "encoder": self.encoder}
