"""startup.calibration's token hook: the batcher's token budget for families that report
their items' lengths."""

from __future__ import annotations

from serve_app.adapters import embeddings
from serve_app.adapters.embeddings.modeldir import TextItem
from serve_app.config.args import parse_args
from serve_app.startup.calibration import length_packing


def test_the_default_budget_is_the_batch_cap_at_the_token_limit() -> None:
    model = embeddings.build(parse_args({}))
    packing = length_packing(parse_args({}), model.backend, 32)
    assert packing["max_batch_tokens"] == 32 * 256  # MiniLM's max_seq_length
    (item,) = model.backend.prepare(["a few words here"])
    assert packing["cost"](item) == item.estimate == len("a few words here") // 4 + 3
    assert packing["cost"](TextItem.of_ids([101, 7, 102])) == 3


def test_max_batch_tokens_overrides_it_and_other_backends_get_none() -> None:
    args = parse_args({"max_batch_tokens": 4096})
    assert length_packing(args, embeddings.build(args).backend, 32)["max_batch_tokens"] == 4096
    assert length_packing(args, object(), 32) == {}  # type: ignore[arg-type]
