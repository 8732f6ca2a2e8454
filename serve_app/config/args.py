"""The one schema for the app's args, validated when the app is built.

Every file in ``configs/`` is a standard Ray Serve config; its ``applications[].args`` are
validated here. Errors name the field path, quote the bad value and say the fix.
"""

from __future__ import annotations

import re
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from serve_app.config.messages import validation_messages
from serve_app.errors import ConfigError

AdapterKind = Literal["embeddings", "image-classification", "rerank", "text-classification"]
CachePolicy = Literal["always", "threshold", "never"]
Enforcement = Literal["torch", "mps", "both"]
MPS_VARS = ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
IMPORT_PATH = "serve_app.app:build_app"
DEFAULT_DEPLOYMENT_NAME = "model"
# The families whose batches are packed by tokens (max_batch_tokens).
TOKEN_FAMILIES = ("embeddings", "rerank", "text-classification")
# A user model's class by import path (docs/custom-models.md): dotted module, a colon, a class.
IMPORT_PATH_SHAPE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
# A user model's wire spec by name: json (the generic POST /v1/predict) or a built-in family's.
# Each has an entry in serve_app.adapters.custom.wires.WIRES (a unit test checks they agree).
WireName = Literal["json", "embeddings", "rerank", "predict"]


_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB)?\s*$")
_UNIT = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def parse_bytes(text: str) -> int:
    """``"6GiB"`` -> 6442450944; binary units only, so that a budget is never off by 7%."""
    m = _BYTES.match(text)
    if m is None:
        raise ValueError(
            f"{text!r} is not a byte count; use an integer or a number with B, KiB, MiB, GiB "
            "or TiB (e.g. 6GiB)"
        )
    return int(float(m.group(1)) * _UNIT[m.group(2)])


def is_import_path(adapter: str) -> bool:
    """Whether ``args.adapter`` names a user model's class (``module:Class``), not a family."""
    return IMPORT_PATH_SHAPE.match(adapter) is not None


class MemoryArgs(BaseModel):
    """How a replica uses its share of the GPU (ignored on the CPU)."""

    model_config = ConfigDict(extra="forbid")

    memory_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Optional hard cap as a fraction of the device, smaller than num_gpus.",
    )
    cache_policy: CachePolicy = Field(
        default="threshold", description="When cached memory goes back to the device."
    )
    cache_threshold_fraction: float = Field(
        default=0.10,
        ge=0,
        le=1,
        description="threshold policy: free when reserved-but-unallocated exceeds this "
        "share of the budget.",
    )
    calibrate: bool = Field(
        default=True, description="Find the largest batch that fits the budget at start-up."
    )
    calibration_max_batch_size: int = Field(
        default=256, ge=1, le=65536, description="Largest batch calibration tries."
    )
    calibration_cache_dir: str | None = Field(
        default="auto",
        max_length=4096,
        description="Directory of the calibration cache: a replica whose model, input limits, "
        "budget, GPU and versions match a stored calibration starts from it instead of "
        "probing. auto: $XDG_CACHE_HOME/serve_app/calibration, else "
        "~/.cache/serve_app/calibration; null or empty: no cache.",
    )
    enforcement: Enforcement = Field(
        default="torch",
        description="What holds a replica to its budget. torch: PyTorch's allocator cap "
        "(set_per_process_memory_fraction), which memory allocated outside PyTorch escapes "
        "(reported as an escape within a second). mps: each replica is an MPS client with a "
        "driver-enforced limit equal to its budget, which nothing in the process can pass, and "
        "replicas' kernels run concurrently; needs an MPS control daemon (serve-app run starts "
        "one). both: the two together. See docs/mps.md.",
    )
    compute_share: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="mps/both only: the share of the GPU's SMs a replica may use "
        "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE). Default: all of them.",
    )
    budget: int | None = Field(
        default=None,
        ge=1 << 20,
        le=1 << 50,
        description="The replica's GPU memory budget in bytes: an integer, or a string with a "
        "binary unit (6GiB, 512MiB). The share Ray schedules (ray_actor_options.num_gpus) is "
        "derived from it and the GPU's memory, rounded up to Ray's 1/10000 (docs/planning.md).",
    )

    @field_validator("budget", mode="before")
    @classmethod
    def _parse_budget(cls, value: object) -> object:
        return parse_bytes(value) if isinstance(value, str) else value

    @property
    def budget_bytes(self) -> int | None:
        return self.budget

    @model_validator(mode="after")
    def _check_mps(self) -> MemoryArgs:
        if self.compute_share is not None and self.enforcement == "torch":
            raise ValueError(
                f"compute_share ({self.compute_share:g}) needs enforcement mps or both (MPS sets "
                "it); set enforcement: mps or remove compute_share"
            )
        return self


class AppArgs(BaseModel):
    """``applications[].args`` of a serve_app application."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    adapter: str = Field(
        default="embeddings",
        description="Model family, or a user model's class by import path (module:Class, "
        "e.g. mypkg.models:MyModel; see docs/custom-models.md).",
    )
    wire: WireName | None = Field(
        default=None,
        description="User models only: the HTTP wire spec. json (the default): POST "
        "/v1/predict, {'inputs': [...]} -> {'outputs': [...]}; or a built-in family's, by name.",
    )
    adapter_options: dict[str, Any] = Field(
        default_factory=dict,
        description="User models only: keyword arguments for the class's constructor.",
    )
    model_name: str = Field(
        default="all-MiniLM-L6-v2",
        min_length=1,
        max_length=200,
        description="Name clients pass as `model`.",
    )
    model_path: str | None = Field(
        default=None,
        description="Local weights directory or file. Default: the packaged MiniLM "
        "(embeddings) or none (image classification, rerank and text-classification need it "
        "unless load_format is dummy; see docs/models.md).",
    )
    arch: str = Field(default="resnet50", description="Image classifier architecture name.")
    labels_path: str | None = Field(
        default=None, description="Image classifier: text file with one label per line."
    )
    load_format: Literal["auto", "dummy"] = Field(
        default="auto", description="dummy: real architecture, random weights."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto")
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        default="float32", description="Model dtype on the GPU (the CPU always uses float32)."
    )
    normalize: bool = Field(default=True, description="Embeddings: L2-normalise vectors.")
    max_batch_size: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="Cap on the dynamic batch size. On a GPU, calibration picks the largest "
        "batch that fits the budget and this caps it; on the CPU it defaults to 32.",
    )
    max_batch_tokens: int | None = Field(
        default=None,
        ge=1,
        le=1 << 24,
        description="Embeddings, rerank and text-classification: cap on a batch's padded "
        "tokens (its inputs x its longest), as text-embeddings-inference's --max-batch-tokens; "
        "batches also take inputs of like lengths together. Default: the batch cap x "
        "max_input_tokens (on a GPU, what calibration measured to fit).",
    )
    batch_wait_timeout_s: float = Field(
        default=0.0,
        ge=0,
        le=10,
        description="How long a batch may wait for more inputs after its first arrived. The "
        "default, 0, runs a batch as soon as the model is free: under load, the next batch "
        "fills while the current one runs, and a wait only adds to every request's latency "
        "(and so caps a closed-loop client's throughput).",
    )
    warmup: bool = Field(
        default=True,
        description="On a GPU, run batches of the shapes traffic brings (batch sizes, and "
        "token lengths for embeddings) before serving, so first requests do not pay for "
        "CUDA's lazy kernel loading.",
    )
    warmup_startup_budget_s: float = Field(
        default=0.5,
        ge=0.0,
        le=600.0,
        description="Seconds of warm-up start-up may spend (smallest batches first); the "
        "batches left run between batches once the replica serves. 0 runs every warm-up "
        "batch after the replica serves.",
    )
    cuda_graphs: bool = Field(
        default=True,
        description="On a GPU, capture the forward pass as CUDA graphs once the weights are "
        "loaded (before calibration, which then measures beside them) and replay them for "
        "batches up to cuda_graph_max_batch_size, padded up to the next captured size: a "
        "batch's launch then costs microseconds of CPU, not milliseconds. false runs every "
        "batch eagerly.",
    )
    cuda_graph_max_batch_size: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Largest batch run through a CUDA graph; larger batches run eagerly. "
        "Default: memory.calibration_max_batch_size (256) for the text families, whose batches of "
        "short inputs grow that large and whose graphs are small; 64 for the others.",
    )
    cuda_graph_startup_budget_s: float = Field(
        default=5.0,
        ge=0.0,
        le=600.0,
        description="Seconds of CUDA graph capture start-up may spend (largest shapes first), "
        "counting the model's first launch, which loads its kernels; the shapes left are "
        "captured between batches once the replica serves, and run eagerly until then. The "
        "default covers every shape of the shipped text models (about 3 s on an H200), so "
        "that the first requests do not wait on captures. 0 captures every shape after the "
        "replica serves.",
    )
    warm_workers: int = Field(
        default=2,
        ge=0,
        le=64,
        description="Idle Ray workers each replica keeps ready on its node, started ahead of "
        "time with torch, Ray Serve and serve_app imported (Ray's preload_python_modules, set "
        "by serve-app run), so that a scale-up or a replacement on that node skips Ray's "
        "worker start-up and the imports. Each costs host memory, no GPU memory. 0: none.",
    )
    warm_workers_delay_s: float = Field(
        default=60.0,
        ge=0.0,
        le=3600.0,
        description="Seconds a replica waits, once it has started, before it first asks for "
        "warm workers: their start-up and imports take CPU and slowed a fresh server's first "
        "seconds of serving, so they are kept after them. Until then a scale-up or a "
        "replacement starts cold. 0: at once.",
    )
    max_inputs_per_request: int = Field(default=128, ge=1, le=65536)
    max_input_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Embeddings, rerank (a query and a document together) and "
        "text-classification: longest input accepted, in tokens. Default: the model's "
        "max_seq_length. Longer inputs get HTTP 400, never a silent truncation.",
    )
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, le=1024**3)
    max_image_pixels: int = Field(default=40_000_000, ge=1)
    # Per-request resource budgets (docs/security.md#per-request-resource-budgets).
    max_request_pixels: int = Field(
        default=100_000_000,
        ge=1,
        le=10**12,
        description="Image classification: most pixels one request may make the replica "
        "decode, summed over its images from their headers before any decode (a JPEG that "
        "Pillow decodes counts at the reduced size it decodes at); past it, HTTP 413. At "
        "least max_image_pixels, so that one image of the largest size always fits.",
    )
    max_body_bytes_in_flight: int = Field(
        default=256 * 1024 * 1024,
        ge=1024,
        le=64 * 1024**3,
        description="Most request-body bytes a replica holds at once, from reading a body "
        "until its response: a body larger than this gets HTTP 413; one that would pass it "
        "while others hold it gets HTTP 503 with Retry-After, before it is read.",
    )
    image_size: int = Field(default=224, ge=16, le=4096)
    image_decode: Literal["auto", "cpu", "gpu"] = Field(
        default="auto",
        description="Image classification: where JPEGs are decoded. auto: on the GPU (nvJPEG "
        "through torchvision, batched, cropped there as Pillow would) when the replica has a "
        "GPU and torchvision can decode there, else with Pillow on the request path; cpu: "
        "always Pillow; gpu: nvJPEG, and a replica without it fails at start-up. PNG, CMYK "
        "and other JPEGs nvJPEG does not take go through Pillow either way.",
    )
    top_k: int = Field(default=5, ge=1, le=1000)
    max_queued_items: int = Field(
        default=4096,
        ge=1,
        le=10_000_000,
        description="Most inputs a replica holds waiting for the model; a request that would "
        "pass it gets HTTP 503 with Retry-After at once, before any model work. At least "
        "max_inputs_per_request, so that one request always fits an empty queue.",
    )
    queue_deadline_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="A request whose inputs are all still queued this long after it arrived "
        "gets HTTP 503 with Retry-After (at most request_timeout_s).",
    )
    request_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="A request not answered within this long gets HTTP 504, and its inputs "
        "still queued are dropped.",
    )
    memory: MemoryArgs = Field(default_factory=MemoryArgs)

    @field_validator("adapter")
    @classmethod
    def _check_adapter(cls, value: str) -> str:
        families = get_args(AdapterKind)
        if value in families or is_import_path(value):
            return value
        names = ", ".join(repr(f) for f in families)
        raise ValueError(
            f"not a model family nor an import path; use one of {names}, or a user model's "
            "class as module:Class (e.g. mypkg.models:MyModel)"
        )

    @model_validator(mode="after")
    def _check(self) -> AppArgs:
        if self.adapter == "image-classification" and self.model_name == "all-MiniLM-L6-v2":
            self.model_name = self.arch
        if is_import_path(self.adapter):
            self._check_user_model()
        elif self.wire is not None or self.adapter_options:
            field = "wire" if self.wire is not None else "adapter_options"
            raise ValueError(
                f"{field} applies to a user model (adapter: module:Class) only; remove it or "
                f"set adapter to an import path (adapter is {self.adapter!r})"
            )
        if self.max_batch_tokens is not None and self.adapter not in TOKEN_FAMILIES:
            raise ValueError(
                f"max_batch_tokens applies to {', '.join(TOKEN_FAMILIES)} only (adapter is "
                f"{self.adapter!r}); remove it"
            )
        if self.max_queued_items < self.max_inputs_per_request:
            raise ValueError(
                f"max_queued_items ({self.max_queued_items}) is smaller than "
                f"max_inputs_per_request ({self.max_inputs_per_request}): a full request could "
                "never be queued; raise max_queued_items or lower max_inputs_per_request"
            )
        if self.adapter == "image-classification" and (
            self.max_request_pixels < self.max_image_pixels
        ):
            raise ValueError(
                f"max_request_pixels ({self.max_request_pixels}) is smaller than "
                f"max_image_pixels ({self.max_image_pixels}): an image of the largest accepted "
                "size could never be served; raise max_request_pixels or lower max_image_pixels"
            )
        if self.queue_deadline_s > self.request_timeout_s:
            raise ValueError(
                f"queue_deadline_s ({self.queue_deadline_s:g}) is longer than "
                f"request_timeout_s ({self.request_timeout_s:g}): the timeout would always "
                "come first; lower queue_deadline_s or raise request_timeout_s"
            )
        return self

    def _check_user_model(self) -> None:
        """A user model's defaults: named after its class, run eagerly unless asked for graphs
        (its predict is not known to be capturable), on the generic JSON wire."""
        if "model_name" not in self.model_fields_set:
            self.model_name = self.adapter.rsplit(":", 1)[1]
        if "cuda_graphs" not in self.model_fields_set:
            self.cuda_graphs = False
        if self.wire is None:
            self.wire = "json"


def parse_args(raw: dict[str, Any] | None, prefix: str = "args") -> AppArgs:
    """Validate an application's args; raise ConfigError listing every bad field."""
    try:
        return AppArgs.model_validate(raw or {})
    except ValidationError as exc:
        lines = validation_messages(exc, prefix)
        raise ConfigError("invalid serve_app config:\n  " + "\n  ".join(lines)) from None
