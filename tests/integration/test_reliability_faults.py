"""The fast part of the CPU fault suite (load_tests.reliability.faults) in CI: hostile bodies
against a CPU replica.

Each body (a gzip bomb with Content-Encoding: gzip, a Content-Length longer or shorter than the
body, deep JSON nesting, a huge string, a body over the limit) gets a deliberate answer or a
closed connection, never a 5xx or a hang, and a normal request right after it is answered. The
replica's body limit is small here (64 KiB), so the huge string costs milliseconds; under the
default 8 MiB limit the suite measured it at ~8 s of tokenizer time (a 504 at
request_timeout_s).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from load_tests.reliability.faults import hostile

MAX_BODY_BYTES = 65536
ARGS = {"adapter": "embeddings", "max_batch_size": 8, "max_body_bytes": MAX_BODY_BYTES}
EXPECTED = {
    "hostile:gzip_bomb": 415,  # a compressed body is refused before it is read
    "hostile:content_length_longer_than_body": "closed",  # HAProxy drops the cut request
    "hostile:content_length_shorter_than_body": 200,  # the declared body; the rest is dropped
    "hostile:deep_json_array": 400,  # past orjson's depth limit
    "hostile:deep_json_input": 400,  # parsed, but input[0] is not a string
    "hostile:huge_string_under_limit": 400,  # too many tokens
    "hostile:body_over_limit": 413,
}


@pytest.fixture(scope="module")
def victim(cluster) -> Iterator[str]:
    yield cluster.deploy("hostile", "/hostile", ARGS, ray_actor_options={"num_cpus": 0.5})
    cluster.delete("hostile")


def test_hostile_bodies_are_refused_and_the_replica_serves_on(victim: str) -> None:
    rows = {r.fault: r for r in hostile(victim, MAX_BODY_BYTES)}
    answers = {name: row.detail["answer"] for name, row in rows.items()}
    assert answers == EXPECTED
    for name, row in rows.items():
        assert row.lost == 0, (name, row)
        assert row.detail["took_s"] < 10.0, (name, row)
        assert row.recovery_s is not None and row.recovery_s < 15.0, (name, row)
