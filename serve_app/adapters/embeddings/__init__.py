"""Sentence embeddings: OpenAI-style ``/v1/embeddings`` (spec.py) over a BERT-family encoder
(backend.py)."""

from serve_app.adapters.contract import Model
from serve_app.adapters.embeddings.backend import SentenceEncoder
from serve_app.adapters.embeddings.spec import EmbeddingsSpec
from serve_app.config.args import AppArgs
from serve_app.gpu.capping import OutsideTorchHook


def build(args: AppArgs) -> Model:
    """The embeddings model for an application's args (nothing touches a device yet)."""
    backend = SentenceEncoder(args)
    return Model(args.model_name, EmbeddingsSpec(args, backend), backend)


def outside_torch_hook(args: AppArgs) -> OutsideTorchHook | None:
    """None: the encoder keeps nothing outside torch beyond what refit counts."""
    return None


__all__ = ["EmbeddingsSpec", "SentenceEncoder", "build", "outside_torch_hook"]
