"""A BERT encoder in plain PyTorch, with transformers' module names (BertModel's state dicts load
as-is), for the embeddings adapter.

Why not transformers' BertModel: importing it costs every Ray worker seconds (transformers pulls
torch.distributed, sklearn and sympy in through its model-loading code;
benchmarks/results/startup/import_probe_h200_*.json), on the path of every cold start. This
module imports torch alone.

What it covers: ``model_type`` "bert" with absolute position embeddings, as an encoder (no
decoder, no cross-attention), with the activations in ``ACTIVATIONS``: all-MiniLM-L6-v2 and
the other BERT-based sentence-transformers models. ``unsupported`` names what a config asks
for beyond that; the backend then uses transformers' AutoModel and says so in its log and
report. tests/unit/adapters/test_bert.py checks that it computes what transformers' BertModel
computes, with the packaged weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from serve_app.errors import ConfigError

# The attention kernels the encoders may use: any of SDPA's but cuDNN's, which compiles a kernel
# with NVRTC for each new shape of a masked fp16 batch, tens of milliseconds each on a loaded
# replica's model thread (benchmarks/results/profile/throughput_x1_r8_h200_e0b0349). The
# memory-efficient kernel takes the same mask, precompiled. sdpa_kernel sets process-wide flags
# for its ``with`` block: safe because a replica runs its forward passes on one thread.
ATTENTION_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]

# config.json's hidden_act -> the function (transformers' ACT2FN names): "gelu" is the exact
# (erf) GELU; gelu_new and gelu_pytorch_tanh are the tanh approximation.
ACTIVATIONS: dict[str, Any] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}
# State-dict keys that BertModel checkpoints carry and this encoder does not use: the pooler
# (sentence-transformers pools itself), a pre-training head, transformers' index buffers.
IGNORED_PREFIXES = ("pooler.", "cls.", "embeddings.position_ids", "embeddings.token_type_ids")


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    initializer_range: float

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> BertConfig:
        """The encoder's settings from a config.json (``unsupported(doc)`` must be None)."""
        return cls(
            vocab_size=int(doc["vocab_size"]),
            hidden_size=int(doc["hidden_size"]),
            num_hidden_layers=int(doc["num_hidden_layers"]),
            num_attention_heads=int(doc["num_attention_heads"]),
            intermediate_size=int(doc["intermediate_size"]),
            hidden_act=str(doc.get("hidden_act", "gelu")),
            max_position_embeddings=int(doc.get("max_position_embeddings", 512)),
            type_vocab_size=int(doc.get("type_vocab_size", 2)),
            layer_norm_eps=float(doc.get("layer_norm_eps", 1e-12)),
            initializer_range=float(doc.get("initializer_range", 0.02)),
        )


def unsupported(doc: dict[str, Any]) -> str | None:
    """Why this encoder cannot run the model of config.json ``doc``, or None when it can."""
    if doc.get("model_type") != "bert":
        return f"model_type is {doc.get('model_type')!r}, not 'bert'"
    if doc.get("position_embedding_type", "absolute") != "absolute":
        return f"position_embedding_type is {doc['position_embedding_type']!r}, not 'absolute'"
    if doc.get("is_decoder") or doc.get("add_cross_attention"):
        return "it is a decoder (is_decoder or add_cross_attention)"
    if doc.get("hidden_act", "gelu") not in ACTIVATIONS:
        return f"hidden_act {doc.get('hidden_act')!r} is not one of {sorted(ACTIVATIONS)}"
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers") if k not in doc]
    missing += [k for k in ("num_attention_heads", "intermediate_size") if k not in doc]
    if missing:
        return f"config.json lacks {', '.join(missing)}"
    if int(doc["hidden_size"]) % int(doc["num_attention_heads"]):
        return "hidden_size is not a multiple of num_attention_heads"
    return None


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        # Without token_type_ids every token is of type 0, as BertModel assumes; a cross-encoder
        # passes its pairs' segments (serve_app/adapters/text).
        if token_type_ids is None:
            types = self.token_type_embeddings.weight[0]
        else:
            types = self.token_type_embeddings(token_type_ids)
        x = self.word_embeddings(input_ids) + types
        return self.LayerNorm(x + self.position_embeddings(positions))


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (
            lin(x).view(b, n, self.heads, -1).transpose(1, 2)
            for lin in (self.query, self.key, self.value)
        )
        # keep: (batch, 1, 1, keys), True where a key is a real token (what BertModel's SDPA
        # path builds from attention_mask).
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return out.transpose(1, 2).reshape(b, n, -1)


class BertSelfOutput(nn.Module):
    """Dense, then LayerNorm over the residual: BertSelfOutput and BertOutput alike."""

    def __init__(self, in_size: int, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(in_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg.hidden_size, cfg)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, keep), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertSelfOutput(cfg.intermediate_size, cfg)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, keep)
        return self.output(self.intermediate(x), x)


class BertStack(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))


class BertEncoder(nn.Module):
    """BertModel without its pooler: (input_ids, attention_mask) -> the last hidden state."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertStack(cfg)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        keep = attention_mask.bool()[:, None, None, :]
        x = self.embeddings(input_ids, token_type_ids)
        with sdpa_kernel(ATTENTION_BACKENDS):
            for layer in self.encoder.layer:
                x = layer(x, keep)
        return x

    def init_random(self) -> None:
        """BertModel's initialisation (for load_format: dummy): normal(0, initializer_range)
        weights, zero biases, unit LayerNorms."""
        std = self.config.initializer_range
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Linear | nn.Embedding):
                    m.weight.normal_(0.0, std)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    m.bias.zero_()
                if isinstance(m, nn.LayerNorm):
                    m.weight.fill_(1.0)
                    m.bias.zero_()

    def load_checkpoint(self, state: dict[str, torch.Tensor], source: str) -> None:
        """BertModel weights (``bert.``-prefixed ones too), the unused keys in IGNORED_PREFIXES
        left out. Built on the meta device, the module takes the tensors themselves.

        Raises:
            ConfigError: a weight is missing, unexpected or of the wrong shape; the message
                names ``args.model_path`` and the keys.
        """
        wanted = dict(self.state_dict(keep_vars=True))
        found: dict[str, torch.Tensor] = {}
        for key, value in state.items():
            name = key[5:] if key.startswith("bert.") else key
            if not name.startswith(IGNORED_PREFIXES):
                found[name] = value
        missing = sorted(set(wanted) - set(found))
        extra = sorted(set(found) - set(wanted))
        shapes = [
            f"{k} {tuple(found[k].shape)} != {tuple(wanted[k].shape)}"
            for k in set(wanted) & set(found)
            if found[k].shape != wanted[k].shape
        ]
        if missing or extra or shapes:
            raise ConfigError(
                f"args.model_path: the weights in {source!r} do not match its config.json as a "
                f"BERT encoder: missing {missing[:5]}, unexpected {extra[:5]}, shapes "
                f"{sorted(shapes)[:5]}; point model_path at a sentence-transformers BERT model"
            )
        self.load_state_dict(found, strict=True, assign=True)
