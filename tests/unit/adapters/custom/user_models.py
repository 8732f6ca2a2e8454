"""Tiny real torch models written as users write them, for the user-model tests (imported by
path, ``tests.unit.adapters.custom.user_models:Name``, as a config names them)."""

from __future__ import annotations

from typing import Any

import torch

WIDTH = 8


class Doubler:
    """Each input, a list of WIDTH numbers, times a fixed matrix (2 x the identity)."""

    def __init__(self, scale: float = 2.0) -> None:
        self.scale = scale
        self.batches: list[int] = []

    def setup(self, device: torch.device) -> None:
        self.device = device
        self.layer = torch.nn.Linear(WIDTH, WIDTH, bias=False).to(device)
        with torch.no_grad():
            self.layer.weight.copy_(torch.eye(WIDTH) * self.scale)

    def predict(self, batch: list[Any]) -> list[Any]:
        self.batches.append(len(batch))
        x = torch.tensor(batch, dtype=torch.float32, device=self.device)
        return list(self.layer(x))  # tensors: serve_app makes them JSON


class WithExamples(Doubler):
    """Doubler that can say its largest inputs, so calibration can size its batches."""

    def example_inputs(self, n: int) -> list[Any]:
        return [[1.0] * WIDTH for _ in range(n)]


class Decoding(Doubler):
    """Doubler whose inputs are texts of digits, checked and decoded by the user's code."""

    input_schema = {"type": "string", "pattern": f"^[0-9]{{{WIDTH}}}$"}
    output_schema = {"type": "object", "properties": {"sum": {"type": "number"}}}

    def decode_request(self, text: Any) -> list[float]:
        if not isinstance(text, str) or len(text) != WIDTH or not text.isdigit():
            raise ValueError(f"each input must be {WIDTH} digits")
        return [float(c) for c in text]

    def encode_response(self, output: Any) -> dict[str, Any]:
        return {"sum": float(sum(output))}


class Embedder(Doubler):
    """Texts to unit vectors of WIDTH floats (their bytes' counts), for wire: embeddings."""

    def predict(self, batch: list[Any]) -> list[Any]:
        x = torch.zeros(len(batch), WIDTH)
        for row, text in enumerate(batch):
            for b in text.encode():
                x[row, b % WIDTH] += 1.0
        return torch.nn.functional.normalize(x, dim=1)  # a tensor of rows: one per input


class Ragged(Doubler):
    """Embedder's outputs of a length that depends on the input: not an embedding."""

    def predict(self, batch: list[Any]) -> list[Any]:
        return [[0.5] * (1 + len(t)) for t in batch]


class DropsOne(Doubler):
    """Returns one output too few: the contract's commonest slip."""

    def predict(self, batch: list[Any]) -> list[Any]:
        return super().predict(batch)[:-1]


class ReturnsDict(Doubler):
    def predict(self, batch: list[Any]) -> Any:
        return {"outputs": super().predict(batch)}


class Raises(Doubler):
    def predict(self, batch: list[Any]) -> list[Any]:
        raise KeyError("weights missing a layer")


class SetupRaises(Doubler):
    def setup(self, device: torch.device) -> None:
        raise FileNotFoundError("/models/mine.safetensors")


class ConstructorRaises(Doubler):
    def __init__(self) -> None:
        raise RuntimeError("no licence key")


class OutOfMemoryPast2(WithExamples):
    """Raises torch's own out-of-memory error for batches of more than two inputs, as a model
    under a tight cap does: the OOM split must see it untouched."""

    def predict(self, batch: list[Any]) -> list[Any]:
        if len(batch) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().predict(batch)


class NoPredict:
    def setup(self, device: torch.device) -> None:
        pass


class PredictTakesTwo(Doubler):
    def predict(self, batch: list[Any], extra: int) -> list[Any]:  # type: ignore[override]
        return []


class SchemaNotADict(Doubler):
    input_schema = "string"


NOT_A_CLASS = 42


class Graphed(WithExamples):
    """WithExamples split for CUDA graphs: collate (the host part) and forward (the device
    part); predict is the two together."""

    def collate(self, batch: list[Any]) -> torch.Tensor:
        return torch.tensor(batch, dtype=torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def predict(self, batch: list[Any]) -> list[Any]:
        return list(self.forward(self.collate(batch).to(self.device)))


class GraphedWrong(Graphed):
    """A forward that is not predict's: graphs would change the answers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x) + 1.0

    def predict(self, batch: list[Any]) -> list[Any]:
        return list(self.layer(self.collate(batch)))


class BadExamples(Decoding):
    """Its example inputs are not what its decode_request takes."""

    def example_inputs(self, n: int) -> list[Any]:
        return [[1.0] * WIDTH for _ in range(n)]


def byte_counts(texts: list[str]) -> torch.Tensor:
    """Each text's bytes counted into WIDTH bins, a row per text."""
    x = torch.zeros(len(texts), WIDTH)
    for row, text in enumerate(texts):
        for b in text.encode():
            x[row, b % WIDTH] += 1.0
    return x


def seeded(layer: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``layer`` with weights drawn from ``seed``: the same model in every process."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return layer


class PairScorer:
    """A cross-encoder of sorts for wire: rerank: (query, document) pairs -> one score each, a
    bilinear form of the two texts' normalised byte counts."""

    def setup(self, device: torch.device) -> None:
        self.device = device
        self.layer = seeded(torch.nn.Bilinear(WIDTH, WIDTH, 1), 0).to(device)
        self.batches: list[int] = []

    def predict(self, batch: list[Any]) -> Any:
        self.batches.append(len(batch))
        q = torch.nn.functional.normalize(byte_counts([p[0] for p in batch]), dim=1)
        d = torch.nn.functional.normalize(byte_counts([p[1] for p in batch]), dim=1)
        return self.layer(q.to(self.device), d.to(self.device))[:, 0]  # one float per pair

    def example_inputs(self, n: int) -> list[Any]:
        return [["q" * 64, "d" * 512] for _ in range(n)]  # JSON-style lists: taken as pairs


class PairScorerColumn(PairScorer):
    """PairScorer's scores as a column, (n, 1), as a one-label classifier gives them."""

    def predict(self, batch: list[Any]) -> Any:
        return super().predict(batch)[:, None]


class TwoScoresPerPair(PairScorer):
    def predict(self, batch: list[Any]) -> Any:
        return torch.stack([super().predict(batch)] * 2, dim=1)


class NanScorer(PairScorer):
    def predict(self, batch: list[Any]) -> Any:
        return [float("nan")] * len(batch)


class BadPairExamples(PairScorer):
    """Its example inputs are texts, not the (query, document) pairs the rerank wire gives."""

    def example_inputs(self, n: int) -> list[Any]:
        return ["q" * 64] * n


class Unlabelled:
    """Texts or text pairs -> a softmax over three classes, for wire: predict, with no labels
    (the wire names them LABEL_0, ...)."""

    classes = 3

    def setup(self, device: torch.device) -> None:
        self.layer = seeded(torch.nn.Linear(2 * WIDTH, self.classes), 1).to(device)

    def predict(self, batch: list[Any]) -> list[list[float]]:
        first = [x if isinstance(x, str) else x[0] for x in batch]
        second = ["" if isinstance(x, str) else x[1] for x in batch]
        x = torch.cat([byte_counts(first), byte_counts(second)], dim=1)
        return self.layer(x).softmax(dim=1).tolist()  # plain lists of floats

    def example_inputs(self, n: int) -> list[Any]:
        return [("p" * 256, "h" * 256) if i % 2 else "t" * 512 for i in range(n)]


class Sentiment(Unlabelled):
    labels = ["negative", "neutral", "positive"]


class WrongLabelCount(Sentiment):
    labels = ["negative", "neutral", "positive", "mixed"]


class LabelsNotStrings(Sentiment):
    labels = [0, 1, 2]  # type: ignore[list-item]


class RaggedScores(Unlabelled):
    def predict(self, batch: list[Any]) -> list[list[float]]:
        return [[0.5] * (1 + i) for i in range(len(batch))]
