"""A user model for tests/integration/test_request_ids.py, named by import path
(``tests.integration.failing_model:Doubles``): numbers in, doubled out, and a bug a user's model
may have: an input ``"fail"`` makes ``predict`` raise, which the replica answers with a JSON 500
and an error id whose traceback its log has."""

from __future__ import annotations

from typing import Any

import torch


class Doubles:
    def setup(self, device: torch.device) -> None:
        self.device = device

    def predict(self, batch: list[Any]) -> list[Any]:
        if "fail" in batch:
            raise RuntimeError("asked to fail by its input")
        return [2 * float(x) for x in batch]
