"""Text classification: TEI's ``/predict`` (spec.py) over the text families' sequence
classifier (adapters/text), its labels from the directory's ``id2label``."""

from serve_app.adapters.contract import Model
from serve_app.adapters.text.backend import SequenceClassifier
from serve_app.adapters.textclass.spec import PredictSpec
from serve_app.config.args import AppArgs
from serve_app.gpu.capping import OutsideTorchHook


def build(args: AppArgs) -> Model:
    """The text classifier for an application's args (nothing touches a device yet)."""
    backend = SequenceClassifier(args, "text-classification", field="inputs")
    return Model(args.model_name, PredictSpec(args, backend, backend.dir.multi_label), backend)


def outside_torch_hook(args: AppArgs) -> OutsideTorchHook | None:
    """None: the classifier keeps nothing outside torch beyond what refit counts."""
    return None


__all__ = ["PredictSpec", "SequenceClassifier", "build", "outside_torch_hook"]
