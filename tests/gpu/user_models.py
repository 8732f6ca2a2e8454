"""A user model for the GPU proof (test_custom_model_gpu.py), named by import path
``tests.gpu.user_models:Grabber``: an ordinary small torch model whose inputs may also ask it to
take device memory with the CUDA driver, outside PyTorch (``{"alloc_bytes": N}``) or to give it
back (``{"free": true}``), as a user's library with its own allocator might."""

from __future__ import annotations

from typing import Any

import torch

from serve_app.testing.faults import RawAllocations

WIDTH = 256


class Grabber:
    def setup(self, device: torch.device) -> None:
        self.device = device
        self.net = torch.nn.Sequential(
            torch.nn.Linear(WIDTH, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1)
        ).to(device)
        self.raw = RawAllocations()

    def predict(self, batch: list[Any]) -> list[Any]:
        out: list[Any] = [None] * len(batch)
        rows = [i for i, x in enumerate(batch) if isinstance(x, list)]
        if rows:
            x = torch.tensor([batch[i] for i in rows], dtype=torch.float32, device=self.device)
            for i, score in zip(rows, self.net(x).squeeze(1).tolist(), strict=True):
                out[i] = score
        for i, x in enumerate(batch):
            if isinstance(x, dict) and "alloc_bytes" in x:
                out[i] = self.raw.alloc(int(x["alloc_bytes"]), self.device)
            elif isinstance(x, dict) and x.get("free"):
                out[i] = self.raw.free_all(self.device)
        return out

    def example_inputs(self, n: int) -> list[Any]:
        return [[1.0] * WIDTH for _ in range(n)]
