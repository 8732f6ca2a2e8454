"""memory.budget in bytes -> num_gpus: parsing, the rounding, which GPU, the checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from serve_app.config.args import AppArgs, parse_bytes
from serve_app.config.deploy import check_deploy_config
from serve_app.config.shares import (
    UNITS,
    booked_share,
    replica_budget_problem,
    share_for_budget,
)
from serve_app.gpu.calibcache import CacheEntry, build_key, store
from serve_app.gpu.calibrate import CalibrationResult
from serve_app.ops.cli import main
from serve_app.plan.derive import GpuFacts, derive_shares, facts_from_flags, stored_need_bytes

GIB = 1 << 30
H200 = 150_754_820_096  # NVML's total_memory of the H200 in benchmarks/results (illustrative)


def doc_with(budget: object, opts: dict | None = None, args: dict | None = None) -> dict:
    return {
        "applications": [
            {
                "name": "emb",
                "route_prefix": "/",
                "import_path": "serve_app.app:build_app",
                "args": {**(args or {}), "memory": {"budget": budget}},
                "deployments": [
                    {"name": "model", "num_replicas": 2, "ray_actor_options": opts or {}}
                ],
            }
        ]
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [("6GiB", 6 * GIB), ("512MiB", 512 << 20), ("1.5GiB", 3 * GIB // 2), ("1048576", 1 << 20)],
)
def test_budget_parses_integers_and_binary_units(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected
    assert AppArgs.model_validate({"memory": {"budget": text}}).memory.budget_bytes == expected


@pytest.mark.parametrize("bad", ["6GB", "six GiB", "-1GiB", 100])
def test_a_bad_budget_names_the_field(bad: object) -> None:
    errors = check_deploy_config(doc_with(bad, {"num_gpus": 0.1}))
    assert any(e.startswith("applications[0].args.memory.budget") for e in errors), errors


def test_the_share_rounds_up_to_rays_unit_so_the_budget_is_never_short() -> None:
    for budget in (GIB, 6 * GIB, 6 * GIB + 1, 12_345_678_901, 70 * GIB):
        share = share_for_budget(budget, H200)
        assert round(share * UNITS) == share * UNITS  # a whole number of Ray's units
        assert int(booked_share(share) * H200) >= budget  # the replica's budget, as Ray books it
        assert int(booked_share(share - 1 / UNITS) * H200) < budget  # and the least such share
    with pytest.raises(ValueError, match="more than the GPU"):
        share_for_budget(H200 + 1, H200)


def test_the_share_is_what_ray_books_not_the_written_number() -> None:
    # The H200 run's images budget: 0.0249 x 10000 is 248.99999999999997, so Ray booked 0.0248
    # and the replica refused to start below its budget; the derived share must book enough.
    cuda_total, budget = 150_109_880_320, 3_732_574_209
    assert booked_share(0.0249) == 0.0248
    assert int(0.0249 * cuda_total) >= budget > int(0.0248 * cuda_total)
    share = share_for_budget(budget, cuda_total)
    assert share == 0.025
    assert replica_budget_problem(budget, booked_share(share), cuda_total, True) is None
    assert replica_budget_problem(budget, booked_share(0.0249), cuda_total, True) is not None


def test_check_refuses_a_written_share_that_ray_books_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = doc_with("3732574209", {"num_gpus": 0.0249})
    src = tmp_path / "plan.yaml"
    src.write_text(yaml.safe_dump(doc))
    assert main(["check", str(src), "--gpu-memory", "150109880320"]) != 0
    err = capsys.readouterr().err
    assert "num_gpus: 0.0249 (Ray books 0.0248)" in err and "use 0.025" in err, err


@given(budget=st.integers(1, H200), total=st.integers(16 * GIB, 200 * GIB))
def test_any_derived_share_books_its_budget(budget: int, total: int) -> None:
    if budget > total:
        return
    share = share_for_budget(budget, total)
    assert replica_budget_problem(budget, booked_share(share), total, True) is None


def test_derive_writes_num_gpus_from_the_smallest_gpu_and_says_which() -> None:
    facts = facts_from_flags(["80GiB", "141GiB"])
    out, notes, errors = derive_shares(doc_with("6GiB"), facts)
    assert errors == []
    share = out["applications"][0]["deployments"][0]["ray_actor_options"]["num_gpus"]
    assert share == share_for_budget(6 * GIB, 80 * GIB) == 0.075
    assert any("the smallest GPU (--gpu-memory)" in n and "num_gpus 0.075" in n for n in notes)
    assert check_deploy_config(out) == []


def test_a_pinned_gpu_or_accelerator_type_is_the_one_the_share_is_of() -> None:
    facts = GpuFacts(80 * GIB, {"GPU-aaa": H200}, {"H200": H200}, "--gpu-memory")
    pinned = {"label_selector": {"serve-app/gpu": "GPU-aaa"}}
    out, notes, _ = derive_shares(doc_with("6GiB", pinned), facts)
    assert out["applications"][0]["deployments"][0]["ray_actor_options"]["num_gpus"] == 0.0428
    assert "GPU GPU-aaa (label serve-app/gpu)" in notes[0]
    typed, notes, _ = derive_shares(doc_with("6GiB", {"accelerator_type": "H200"}), facts)
    assert typed["applications"][0]["deployments"][0]["ray_actor_options"]["num_gpus"] == 0.0428
    _, _, errors = derive_shares(doc_with("6GiB", {"accelerator_type": "L4"}), facts)
    assert "accelerator_type L4 (pass --gpu-memory L4=BYTES)" in errors[0]


def test_a_budget_no_gpu_can_hold_or_a_num_gpus_too_small_is_refused() -> None:
    _, _, errors = derive_shares(doc_with("100GiB"), facts_from_flags(["80GiB"]))
    assert "more than the GPU's 85,899,345,920 bytes" in errors[0]
    _, _, errors = derive_shares(doc_with("6GiB", {"num_gpus": 0.05}), facts_from_flags(["80GiB"]))
    assert "num_gpus: 0.05" in errors[0] and "use 0.075" in errors[0]


def test_plain_serve_deploy_of_a_budget_without_num_gpus_is_refused_by_check() -> None:
    errors = check_deploy_config(doc_with("6GiB"))
    assert any("num_gpus: not set, but memory.budget" in e for e in errors), errors


def test_the_replica_refuses_a_budget_it_cannot_keep() -> None:
    assert "no GPU share" in (replica_budget_problem(6 * GIB, 0.0, None, True) or "")
    assert replica_budget_problem(6 * GIB, 0.0, None, False) is None  # CPU-only: ignored
    assert "derived for a larger GPU" in (replica_budget_problem(6 * GIB, 0.0428, 80 * GIB, True))
    assert replica_budget_problem(6 * GIB, 0.0428, H200, True) is None


def test_the_calibration_cache_says_what_the_model_needs(tmp_path: Path) -> None:
    args = {"calibration_cache_dir": str(tmp_path)}
    key = build_key(
        adapter="embeddings",
        model_name="all-MiniLM-L6-v2",
        model_path=None,
        load_format="auto",
        dtype="float32",
        cap_bytes=8 * GIB,
    )
    result = CalibrationResult(4, 3 * GIB, 8 * GIB, 8, "oom", ((1, 2 * GIB), (4, 3 * GIB)))
    assert store(CacheEntry.at(tmp_path, key), result, GIB // 2)
    model = AppArgs.model_validate({"memory": {"budget": "1GiB", **args}})
    assert stored_need_bytes(model) == (2 * GIB, 1)
    doc = doc_with("1GiB", args={})
    doc["applications"][0]["args"]["memory"].update(args)
    _, _, errors = derive_shares(doc, facts_from_flags(["80GiB"]))
    assert "below what this model needs: 2,147,483,648 bytes" in errors[0]


def test_check_write_shares_writes_a_file_serve_deploy_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, out = tmp_path / "in.yaml", tmp_path / "out.yaml"
    src.write_text(yaml.safe_dump(doc_with("6GiB", {"num_cpus": 1})))
    assert main(["check", str(src)]) == 2  # this host: no GPU, no --gpu-memory
    argv = ["check", str(src), "--gpu-memory", "H200=141GiB", "--gpu-memory", str(H200)]
    assert main([*argv, "--write-shares", str(out)]) == 0
    written = yaml.safe_load(out.read_text())
    assert written["applications"][0]["deployments"][0]["ray_actor_options"]["num_gpus"] == 0.0428
    assert main(["check", str(out)]) == 0
    assert "num_gpus 0.0428" in capsys.readouterr().out


def test_serve_app_run_on_a_host_without_a_gpu_drops_the_budget_and_says_so() -> None:
    from serve_app.plan.derive import for_run

    doc, notes = for_run(doc_with("6GiB", {"num_cpus": 1}))  # this host: no GPU
    assert "budget" not in doc["applications"][0]["args"]["memory"]
    assert notes == ["no GPU: emb's memory.budget is ignored on the CPU"]
    assert check_deploy_config(doc) == []


def test_nvml_facts_are_cudas_total_not_nvmls(tmp_path: Path) -> None:
    """A replica's budget is its share of torch's total_memory, which is NVML's total less the
    driver's reserve (on the H200: 150,754,820,096 less 644,939,776): a share derived from
    NVML's larger total held less than the budget there, and the replica refused to start."""
    import json

    from serve_app.gpu import nvml
    from serve_app.plan.derive import facts_from_nvml
    from serve_app.testing.nvml import ScriptedSource

    uuid = "GPU-00000000-0000-4000-8000-000000000001"
    script = tmp_path / "nvml.json"
    figures = {"total_bytes": 150_754_820_096, "reserved_bytes": 644_939_776, "free_bytes": 1 << 30}
    script.write_text(json.dumps({"devices": {uuid: figures}}))
    nvml.set_source(ScriptedSource(script))
    try:
        facts = facts_from_nvml()
    finally:
        nvml.set_source(None)
    assert facts.smallest_bytes == 150_109_880_320
