"""A user's own model, by import path (``args.adapter: mypkg.models:MyModel``): the user's class
(loader.py) wrapped as a model backend (backend.py), on the generic JSON wire spec (spec.py) or
a built-in family's (wires.py). See docs/custom-models.md."""

from serve_app.adapters.contract import Model
from serve_app.adapters.custom.backend import UserModelBackend, UserModelError
from serve_app.adapters.custom.loader import instantiate, load_class
from serve_app.adapters.custom.wires import WIRES
from serve_app.config.args import AppArgs
from serve_app.gpu.capping import OutsideTorchHook


def build(args: AppArgs) -> Model:
    """The user's model for an application's args: its class imported, checked and built
    (its ``setup`` runs later, under the cap).

    Raises:
        ConfigError: the class cannot be imported or lacks a required method (the message
            names ``args.adapter``, the class and the fix).
    """
    user = load_class(args.adapter)
    wire = WIRES[args.wire or "json"]
    instance = instantiate(user, args.adapter_options)
    backend = UserModelBackend(args, user, instance, wire.input_field)
    if wire.output_check is not None:
        backend.output_check = wire.output_check(backend)
    backend.example_input = wire.example_input
    return Model(args.model_name, wire.spec(args, backend), backend)


def outside_torch_hook(args: AppArgs) -> OutsideTorchHook | None:
    """None: what a user model allocates outside torch is found by the refits after its first
    launch and every batch (gpu/partition), and, past its budget, reported as an escape."""
    return None


__all__ = ["WIRES", "UserModelBackend", "UserModelError", "build", "outside_torch_hook"]
