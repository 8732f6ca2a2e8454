"""Cross-encoder reranking: ``/v1/rerank`` in the Cohere/Jina and TEI shapes (spec.py) over
the text families' sequence classifier with one label (adapters/text)."""

from serve_app.adapters.contract import Model
from serve_app.adapters.rerank.spec import RerankSpec
from serve_app.adapters.text.backend import SequenceClassifier
from serve_app.config.args import AppArgs
from serve_app.gpu.capping import OutsideTorchHook


class Reranker(SequenceClassifier):
    """A CrossEncoder directory's one-label classifier; its scores get the directory's
    activation (a sigmoid unless it names Identity), as CrossEncoder.predict gives them."""

    def __init__(self, args: AppArgs):
        super().__init__(args, "rerank", field="documents", pair_note=" with the query")
        self.activation = self.dir.activation


def build(args: AppArgs) -> Model:
    """The reranker for an application's args (nothing touches a device yet)."""
    backend = Reranker(args)
    return Model(args.model_name, RerankSpec(args, backend), backend)


def outside_torch_hook(args: AppArgs) -> OutsideTorchHook | None:
    """None: the classifier keeps nothing outside torch beyond what refit counts."""
    return None


__all__ = ["RerankSpec", "Reranker", "build", "outside_torch_hook"]
