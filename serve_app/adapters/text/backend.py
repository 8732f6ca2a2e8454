"""The sequence classification backend: texts or text pairs (a reranker's query and document)
scored by a BERT-family classifier, one logit per label. Requests are tokenized in ``prepare``
(each pair is one batch item, so a large rerank request batches and calibrates as many
embeddings do); a batch is padded per batch, to a CUDA graph's length bucket when one is
captured, exactly as the embeddings backend pads its batches."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from serve_app import env
from serve_app.adapters.contract import load_state_dict, pow2_sizes, resolve_dtype
from serve_app.adapters.embeddings import bert
from serve_app.adapters.embeddings.backend import (
    GRAPH_LENGTHS,
    PAD_MULTIPLE,
    WARMUP_LENGTHS,
    WEIGHT_FILES,
)
from serve_app.adapters.embeddings.modeldir import TextItem, run_tokenized, token_estimate
from serve_app.adapters.text.model import BertClassifier, HFClassifier
from serve_app.adapters.text.modeldir import ClassifierDir, PairTokenization, Task, Tokens
from serve_app.config.args import AppArgs
from serve_app.errors import ConfigError
from serve_app.gpu.graphs import GraphMemory, GraphSet, graph_batch_sizes, text_batch_shape

logger = logging.getLogger("serve_app")

# A token id every BERT vocabulary has (warm-up and worst-case batches carry it).
FILLER_ID = 1000


class SequenceClassifier:
    """Logits of texts and text pairs from a sequence classification directory.

    Args:
        args: the application's args.
        task: the family it serves (what it loads by default, how it checks its labels).
        field: what the wire spec calls its inputs, for errors ("documents", "inputs").
        pair_note: what a pair's token count includes, for errors (" with the query").
    """

    # prepare makes items without tokenizing (the batch's work): cheap on the event loop.
    prepare_inline = True

    def __init__(self, args: AppArgs, task: Task, field: str, pair_note: str = ""):
        self.args = args
        self.task = task
        self.dir = ClassifierDir.read(args, task)
        self.model_dir = self.dir.path
        self.labels = self.dir.labels
        self.max_positions = int(self.dir.config.get("max_position_embeddings", 512))
        self.tokens = PairTokenization(
            self.model_dir, args, self.max_positions, field=field, pair_note=pair_note
        )
        self.max_tokens = self.tokens.max_tokens
        self.field, self.pair_note = field, pair_note
        self.model: torch.nn.Module | None = None
        self.device = torch.device("cpu")
        self.encoder = ""  # which implementation runs the model: "serve_app" or "transformers"
        self.setup_phases_s: dict[str, float] | None = None
        self.graphs: GraphSet | None = None
        self._graph_sizes: list[int] = []
        self._graph_lengths: list[int] = []

    def setup(self, device: torch.device) -> None:
        env.models_offline()
        t0 = time.perf_counter()
        dtype = resolve_dtype(self.args, device)
        why_not = bert.unsupported(self.dir.config)
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
            t1 = t0  # nothing to import
            model = self._build_bert(device)
        else:
            logger.info(
                "%s: %s, so transformers' AutoModelForSequenceClassification runs it (its import "
                "costs this start seconds)",
                self.model_dir,
                why_not,
            )
            self.encoder = "transformers"
            t1 = time.perf_counter()
            model = self._build_transformers()
        t2 = time.perf_counter()
        self.model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.setup_phases_s = {
            "import": round(t1 - t0, 3),
            "build": round(t2 - t1, 3),
            "to_device": round(time.perf_counter() - t2, 3),
        }
        self.device = device

    def _build_bert(self, device: torch.device) -> BertClassifier:
        """serve_app's classifier: random weights made on the device itself (dummy), or the
        checkpoint's tensors taken as they are."""
        cfg = bert.BertConfig.from_dict(self.dir.config)
        if self.args.load_format == "dummy":
            with torch.device(device):
                model = BertClassifier(cfg, len(self.labels))
            model.init_random()
            return model
        path = next(
            (self.model_dir / n for n in WEIGHT_FILES if (self.model_dir / n).is_file()), None
        )
        if path is None:
            raise ConfigError(
                f"args.model_path: {str(self.model_dir)!r} holds none of {list(WEIGHT_FILES)}; "
                "point it at a CrossEncoder or *ForSequenceClassification directory"
            )
        with torch.device("meta"):
            model = BertClassifier(cfg, len(self.labels))
        model.load_checkpoint(load_state_dict(path), str(path))
        return model

    def _build_transformers(self) -> HFClassifier:
        from transformers import AutoConfig, AutoModelForSequenceClassification

        if self.args.load_format == "dummy":
            config = AutoConfig.from_pretrained(str(self.model_dir), num_labels=len(self.labels))
            return HFClassifier(AutoModelForSequenceClassification.from_config(config))
        model = AutoModelForSequenceClassification.from_pretrained(
            str(self.model_dir), use_safetensors=None
        )
        if model.config.num_labels != len(self.labels):
            raise ConfigError(
                f"args.model_path: {str(self.model_dir)!r} loads with "
                f"{model.config.num_labels} labels, not {len(self.labels)}; fix its config.json"
            )
        return HFClassifier(model)

    def prepare(self, inputs: Sequence[Any]) -> list[TextItem]:
        """Each text or (text, text) pair as a batch item, tokenized with its batch (an
        ItemError from the batch for one longer than ``max_tokens``)."""
        return [TextItem(t, i, self.max_tokens) for i, t in enumerate(inputs)]

    def token_cost(self, item: Any) -> int:
        """What the batcher packs by: the item's tokens, estimated until the batch tokenizes it
        (serve_app.startup.calibration.length_packing)."""
        return token_estimate(item)

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor
    ) -> tuple[torch.Tensor]:
        """Token ids, mask and segment ids (on the device) -> float32 logits: the part a CUDA
        graph holds."""
        assert self.model is not None, "setup() must run before predict()"
        return (self.model(ids, mask, types).float(),)

    def capture_graphs(
        self, max_batch_size: int, budget_s: float | None, memory: GraphMemory
    ) -> GraphSet:
        """CUDA graphs of the forward pass for each batch bucket up to ``max_batch_size`` and
        each of embeddings' GRAPH_LENGTHS within the model's limit (for at most ``budget_s``)."""
        lengths = [n for n in GRAPH_LENGTHS if n <= self.max_tokens]
        sizes = graph_batch_sizes(max_batch_size)
        graphs = GraphSet(self._forward, memory)
        examples = []
        for b in sizes:
            for n in lengths:
                ids = torch.full((b, n), FILLER_ID, dtype=torch.long, device=self.device)
                # a mask with padding, so that no library shortcut for "no padding" is captured
                mask = torch.ones((b, n), dtype=torch.long, device=self.device)
                mask[:, n // 2 :] = 0
                types = torch.zeros((b, n), dtype=torch.int32, device=self.device)
                types[:, n // 4 : n // 2] = 1
                examples.append(((b, n), (ids, mask, types)))
        self.graphs, self._graph_sizes, self._graph_lengths = graphs, sizes, lengths
        graphs.capture_all(examples, budget_s)
        return graphs

    def predict(self, items: Sequence[TextItem | Tokens]) -> list[Any]:
        """Each item's logits (float32, one per label), the batch tokenized in one call here,
        in the model's thread (an ItemError for an item over ``max_tokens``)."""
        batch = [
            TextItem.of_ids(it.ids, it.types) if isinstance(it, Tokens) else it for it in items
        ]
        return run_tokenized(batch, self.tokens, self._predict_ids, self.field, self.pair_note)

    def _predict_ids(self, items: list[TextItem]) -> list[np.ndarray]:
        assert self.model is not None, "setup() must run before predict()"
        graph, longest = text_batch_shape(
            self.graphs,
            self._graph_sizes,
            self._graph_lengths,
            len(items),
            max(len(item.ids or ()) for item in items),
            self.max_positions,
            PAD_MULTIPLE,
        )
        ids_np = np.full((len(items), longest), self.tokens.pad_id, dtype=np.int64)
        mask_np = np.zeros((len(items), longest), dtype=np.int64)
        types_np = np.zeros((len(items), longest), dtype=np.int32)
        for row, item in enumerate(items):
            n = len(item.ids or ())
            ids_np[row, :n] = item.ids or ()
            mask_np[row, :n] = 1
            types_np[row, :n] = item.types or 0
        ids, mask, types = (torch.from_numpy(a) for a in (ids_np, mask_np, types_np))
        with torch.inference_mode():
            if graph is not None:
                assert self.graphs is not None
                (logits,) = self.graphs.run(graph, (ids, mask, types))
            else:
                dev = self.device
                (logits,) = self._forward(ids.to(dev), mask.to(dev), types.to(dev))
            out = logits.cpu().numpy()
        return [out[i] for i in range(len(items))]

    def _item(self, n: int) -> Tokens:
        """An item of ``n`` tokens: a pair of two halves, as a reranker's are."""
        body = [FILLER_ID] * (n - 2)
        return Tokens(
            [self.tokens.cls_id, *body, self.tokens.sep_id], [0] * (n // 2) + [1] * (n - n // 2)
        )

    def worst_case_items(self, n: int) -> list[Tokens]:
        return [self._item(self.max_tokens) for _ in range(n)]

    def warmup_batches(self, max_batch_size: int) -> list[list[Tokens]]:
        lengths = [n for n in WARMUP_LENGTHS if n < self.max_tokens] + [self.max_tokens]
        return [[self._item(n)] * b for n in lengths for b in pow2_sizes(max_batch_size)]

    def describe(self) -> dict[str, Any]:
        card: dict[str, Any] = {
            "id": self.args.model_name,
            "object": "model",
            "owned_by": "serve_app",
            "task": self.task,
            "max_input_tokens": self.max_tokens,
            "load_format": self.args.load_format,
        }
        if self.task == "text-classification":
            card["labels"] = self.labels
        return card

    def report(self) -> dict[str, Any]:
        return {"weights_phases_s": self.setup_phases_s, "encoder": self.encoder}
