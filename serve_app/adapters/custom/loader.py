"""A user model's class, by import path (``args.adapter: mypkg.models:MyModel``): imported,
checked for the methods serve_app calls, and instantiated with ``args.adapter_options``. Every
failure is a ConfigError (or a StartupError for a constructor that raises) naming the field, the
class and the fix."""

from __future__ import annotations

import hashlib
import importlib
import inspect
from dataclasses import dataclass
from typing import Any

from serve_app.errors import ConfigError, StartupError

REQUIRED = {"setup": "setup(self, device)", "predict": "predict(self, batch) -> list"}
"""The methods a user model must have, as docs/custom-models.md writes them."""
OPTIONAL = {
    "example_inputs": "example_inputs(self, n) -> list",
    "decode_request": "decode_request(self, input) -> item",
    "encode_response": "encode_response(self, output) -> JSON value",
    "collate": "collate(self, batch) -> torch.Tensor",
    "forward": "forward(self, x) -> torch.Tensor",
}
"""The methods serve_app calls when a user model has them, and their one argument."""
SCHEMAS = ("input_schema", "output_schema")
"""Optional class attributes: the JSON schema of one input and of one output, which the generic
JSON spec's OpenAPI document shows (any JSON value without them)."""
DOCS = "see docs/custom-models.md"
IMPORTABLE = (
    "make it importable on every Ray worker: install its package in the environment Ray runs, "
    "or start serve-app run from the folder that holds the package (the driver's working "
    "directory is on the workers' path), or add that folder to PYTHONPATH"
)


class NotImportable(ConfigError):
    """The user model's module (or a module it imports) is not found on this host's path."""


@dataclass(frozen=True)
class UserClass:
    """A user model's class, checked.

    Attributes:
        path: its import path, ``module:Class``.
        cls: the class.
        has: the optional methods (``OPTIONAL``) it defines.
        source_digest: 12 hex digits of a SHA-256 of its module's source, or of the path when
            the source cannot be read (so that the calibration cache sees a changed model).
        input_schema: the class's ``input_schema`` (a JSON schema), or None.
        output_schema: the class's ``output_schema`` (a JSON schema), or None.
    """

    path: str
    cls: type
    has: frozenset[str]
    source_digest: str
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None


def load_class(path: str) -> UserClass:
    """Import ``module:Class`` and check it has ``REQUIRED``'s methods.

    Raises:
        NotImportable: the module (or one it imports) is not found here.
        ConfigError: the module raises as it imports, the class is missing or is no class, or
            it lacks a required method; the message names ``args.adapter``, the class and the fix.
    """
    module_name, _, class_name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise NotImportable(
            f"args.adapter: cannot import module {module_name!r} of {path!r} ({exc}); {IMPORTABLE}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any error in the user's module is a config error
        raise ConfigError(
            f"args.adapter: importing {module_name!r} of {path!r} raised "
            f"{type(exc).__name__}: {str(exc)[:300]}; fix the module so that it imports"
        ) from None
    cls = getattr(module, class_name, None)
    if not inspect.isclass(cls):
        what = "has no attribute" if cls is None else f"has a {type(cls).__name__}, not a class,"
        raise ConfigError(
            f"args.adapter: module {module_name!r} {what} {class_name!r}; name the model's "
            f"class after the colon ({DOCS})"
        )
    missing = [sig for name, sig in REQUIRED.items() if not callable(getattr(cls, name, None))]
    if missing:
        raise ConfigError(
            f"args.adapter: {path} lacks {' and '.join(missing)}; a user model needs both ({DOCS})"
        )
    has = frozenset(n for n in OPTIONAL if callable(getattr(cls, n, None)))
    schemas = [getattr(cls, name, None) for name in SCHEMAS]
    for name, schema in zip(SCHEMAS, schemas, strict=True):
        if schema is not None and not isinstance(schema, dict):
            raise ConfigError(
                f"args.adapter: {path}.{name} is a {type(schema).__name__}; make it a dict, "
                f"the JSON schema of one {name.split('_')[0]} ({DOCS})"
            )
    return UserClass(path, cls, has, _digest(module, path), *schemas)


def _digest(module: Any, path: str) -> str:
    try:
        source = inspect.getsource(module).encode()
    except (OSError, TypeError):
        source = path.encode()
    return hashlib.sha256(source).hexdigest()[:12]


def instantiate(user: UserClass, options: dict[str, Any]) -> Any:
    """An instance of the class, built with ``options`` as keyword arguments; its methods'
    signatures checked against how serve_app calls them.

    Raises:
        ConfigError: the constructor does not take ``options`` (``args.adapter_options``), or a
            method cannot be called with one argument.
        StartupError: the constructor raised.
    """
    try:
        inspect.signature(user.cls).bind(**options)
    except TypeError as exc:
        raise ConfigError(
            f"args.adapter_options: {user.path}() does not take {sorted(options)} ({exc}); "
            "pass the keyword arguments its constructor takes"
        ) from None
    except ValueError:  # no signature to read (a class built in C): let the call say
        pass
    try:
        instance = user.cls(**options)
    except Exception as exc:  # noqa: BLE001 - the user's constructor: name it, then stop
        raise StartupError(
            f"{user.path}() raised {type(exc).__name__}: {str(exc)[:300]}; fix the class's "
            "constructor (load weights in setup(device), which runs under the replica's cap)"
        ) from exc
    wanted = {**REQUIRED, **{n: OPTIONAL[n] for n in user.has}}
    for name, sig in wanted.items():
        try:
            inspect.signature(getattr(instance, name)).bind(None)
        except TypeError:
            raise ConfigError(
                f"args.adapter: {user.path}.{name} cannot be called with one argument; "
                f"define it as {sig} ({DOCS})"
            ) from None
        except ValueError:
            pass
    return instance


def check_classes(doc: dict[str, Any], folder: str) -> tuple[list[str], list[str]]:
    """``serve-app check``'s look at each user model's class (``args.adapter: module:Class``),
    imported as ``serve-app run``'s workers import it, with ``folder`` (the working directory)
    on the path: (errors, notes). A module that is not importable here is a note, not an
    error, since the host that serves it may have its package; anything else ``load_class``
    refuses is the error the build would give."""
    import sys

    from serve_app.config.args import is_import_path
    from serve_app.config.walk import applications

    errors: list[str] = []
    notes: list[str] = []
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        for i, app in applications(doc):
            args = app.get("args")
            adapter = args.get("adapter") if isinstance(args, dict) else None
            if not isinstance(adapter, str) or not is_import_path(adapter):
                continue
            try:
                load_class(adapter)
            except NotImportable as exc:
                notes.append(f"applications[{i}].{exc.message}; its class was not checked here")
            except ConfigError as exc:
                errors.append(f"applications[{i}].{exc.message}")
    finally:
        if added:
            sys.path.remove(folder)
    return errors, notes
