"""Image classification: ``/v1/classify`` (spec.py) over a torchvision classifier or the built-in
ResNets (backend.py), with JPEGs decoded on the GPU where nvJPEG is there (gpudecode.py)."""

from serve_app.adapters.contract import Model
from serve_app.adapters.image.backend import ImageClassifier
from serve_app.adapters.image.decoder_memory import hold_decoder_memory
from serve_app.adapters.image.spec import ClassifySpec
from serve_app.config.args import AppArgs
from serve_app.gpu.capping import OutsideTorchHook


def build(args: AppArgs) -> Model:
    """The image classification model for an application's args (nothing touches a device
    yet)."""
    backend = ImageClassifier(args)
    return Model(args.model_name, ClassifySpec(args, backend), backend)


def outside_torch_hook(args: AppArgs) -> OutsideTorchHook | None:
    """nvJPEG's buffers, on a replica that decodes JPEGs on the GPU."""
    return None if args.image_decode == "cpu" else hold_decoder_memory(args)


__all__ = ["ClassifySpec", "ImageClassifier", "build", "outside_torch_hook"]
