"""Locust users for serve_app: closed-loop load to complement the open-loop bench.

    locust -f load_tests/locustfile.py --headless -u 10 -r 5 -t 30s \\
        --host http://127.0.0.1:8000 --csv /tmp/locust EmbeddingsUser

Options added to locust's command line: --embed-model (all-MiniLM-L6-v2, what `serve-app run`
serves), --image-model (resnet50, an image app's default name), --top-k (5), --payload-seed
(0). Any non-2xx response is a failure. Payloads come from load_tests/payloads.py and are
generated on first use, then cached.
"""

from __future__ import annotations

import random
from typing import Any

from locust import HttpUser, between, events, task

try:
    from load_tests import payloads
except ImportError:  # locust puts this file's folder, not the repo root, on sys.path
    import payloads  # type: ignore[no-redef]

N_VARIANTS = 32  # distinct texts per kind, picked at random
N_IMAGE_SEEDS = 4  # distinct images per size
_JSON = {"Content-Type": "application/json"}


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    parser.add_argument(
        "--embed-model",
        default=payloads.DEFAULT_EMBEDDINGS_MODEL,
        help="model for /v1/embeddings",
    )
    parser.add_argument(
        "--image-model", default=payloads.DEFAULT_IMAGE_MODEL, help="model for /v1/classify"
    )
    parser.add_argument("--top-k", type=int, default=5, help="top_k for /v1/classify")
    parser.add_argument("--payload-seed", type=int, default=0, help="seed for payloads")


def _option(user: HttpUser, name: str, default: Any) -> Any:
    return getattr(user.environment.parsed_options, name, default)


def _post(user: HttpUser, path: str, name: str, **kwargs: Any) -> None:
    with user.client.post(path, name=name, catch_response=True, **kwargs) as resp:
        if 200 <= resp.status_code < 300:
            resp.success()
            return
        detail = ""
        try:
            err = resp.json().get("error", {})
            detail = f" {err.get('type', '')}: {err.get('message', '')}"
        except Exception:  # body may be empty or not JSON
            detail = f" {resp.text[:200]!r}" if resp.text else ""
        resp.failure(f"HTTP {resp.status_code}{detail}")


class EmbeddingsUser(HttpUser):
    """Mostly short query texts, some long documents, the odd small batch."""

    wait_time = between(0.05, 0.25)

    def on_start(self) -> None:
        seed = _option(self, "payload_seed", 0)
        self.model = _option(self, "embed_model", payloads.DEFAULT_EMBEDDINGS_MODEL)
        self.short = payloads.texts("short", N_VARIANTS, seed)
        self.long = payloads.texts("long", N_VARIANTS, seed + 1)
        self.rng = random.Random()

    @task(6)
    def short_text(self) -> None:
        body = payloads.embeddings_body(self.rng.choice(self.short), self.model)
        _post(self, "/v1/embeddings", "embeddings short", data=body, headers=_JSON)

    @task(2)
    def long_text(self) -> None:
        body = payloads.embeddings_body(self.rng.choice(self.long), self.model)
        _post(self, "/v1/embeddings", "embeddings long", data=body, headers=_JSON)

    @task(1)
    def short_batch(self) -> None:
        body = payloads.embeddings_body(self.rng.sample(self.short, 8), self.model)
        _post(self, "/v1/embeddings", "embeddings short x8", data=body, headers=_JSON)


class ImageUser(HttpUser):
    """224 px JPEGs mostly, some 512/1024 px; raw image bodies and base64 JSON."""

    wait_time = between(0.1, 0.5)

    def on_start(self) -> None:
        self.seed = _option(self, "payload_seed", 0)
        self.model = _option(self, "image_model", payloads.DEFAULT_IMAGE_MODEL)
        self.top_k = _option(self, "top_k", 5)
        self.rng = random.Random()

    def _seed(self) -> int:
        return self.seed + self.rng.randrange(N_IMAGE_SEEDS)

    def _raw(self, size: int, name: str) -> None:
        data = payloads.image_bytes(size, "jpeg", self._seed())
        _post(
            self,
            f"/v1/classify?top_k={self.top_k}",
            name,
            data=data,
            headers={"Content-Type": "image/jpeg"},
        )

    def _b64(self, size: int, name: str) -> None:
        body = payloads.classify_body(
            payloads.image_b64(size, "jpeg", self._seed()), self.model, self.top_k
        )
        _post(self, "/v1/classify", name, data=body, headers=_JSON)

    @task(4)
    def jpeg_224_raw(self) -> None:
        self._raw(224, "classify 224 jpeg raw")

    @task(2)
    def jpeg_224_base64(self) -> None:
        self._b64(224, "classify 224 jpeg base64")

    @task(1)
    def jpeg_512_raw(self) -> None:
        self._raw(512, "classify 512 jpeg raw")

    @task(1)
    def jpeg_1024_base64(self) -> None:
        self._b64(1024, "classify 1024 jpeg base64")
