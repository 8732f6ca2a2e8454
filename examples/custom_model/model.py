"""A user model for serve_app: a text scorer over byte counts (docs/custom-models.md)."""

import torch

MAX_CHARS = 2000


class ByteScorer:
    """One score per text, from its bytes' frequencies through a small MLP (seeded weights)."""

    input_schema = {"type": "string", "maxLength": MAX_CHARS}  # for the OpenAPI document
    output_schema = {"type": "number"}

    def __init__(self, seed: int = 0, hidden: int = 64):
        self.seed, self.hidden = seed, hidden

    def setup(self, device: torch.device) -> None:
        with torch.random.fork_rng(devices=[]):  # the same weights in every replica
            torch.manual_seed(self.seed)
            mlp = torch.nn.Sequential(
                torch.nn.Linear(256, self.hidden), torch.nn.GELU(), torch.nn.Linear(self.hidden, 1)
            )
        self.device, self.net = device, mlp.to(device).eval()

    def decode_request(self, text: object) -> torch.Tensor:
        if not isinstance(text, str) or len(text) > MAX_CHARS:
            raise ValueError(f"each input must be a text of at most {MAX_CHARS} characters")
        data = torch.tensor(list(text.encode()), dtype=torch.long)
        return torch.bincount(data, minlength=256).float() / max(1, len(data))

    def predict(self, batch: list[torch.Tensor]) -> list[float]:
        return self.net(torch.stack(batch).to(self.device)).squeeze(1).tolist()

    def example_inputs(self, n: int) -> list[str]:
        return ["\u00e9" * MAX_CHARS] * n  # the longest text a request may carry
