"""A user model wrapped as a model backend (serve_app.adapters.custom.backend), with real tiny
torch models: the start-up pipeline around it on the CPU, the contract's checks (setup that
raises, predict with the wrong number of outputs or that raises), the OOM split seeing the
user's out-of-memory errors, and calibration with and without ``example_inputs``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
import torch

from serve_app import adapters
from serve_app.adapters.custom import UserModelBackend, UserModelError
from serve_app.config.args import parse_args
from serve_app.errors import ConfigError, InferenceError, StartupError
from serve_app.serving.http import guarded
from serve_app.serving.oom import ItemTooLarge, is_torch_oom, predict_with_oom_split
from serve_app.startup import pipeline
from serve_app.startup.calibration import BatchCap, check_batch_cap_source, initial_batch_cap

HERE = "tests.unit.adapters.custom.user_models"


def backend_of(name: str, **args: Any) -> UserModelBackend:
    model = adapters.build_model(parse_args({"adapter": f"{HERE}:{name}", **args}))
    assert isinstance(model.backend, UserModelBackend)
    model.backend.setup(torch.device("cpu"))
    return model.backend


def test_start_replica_serves_a_user_model_on_the_cpu() -> None:
    started = pipeline.start_replica(parse_args({"adapter": f"{HERE}:Doubler"}), 0.0)
    assert started.model.name == "Doubler" and started.model.spec.route == "/v1/predict"
    assert started.cap == BatchCap(32)  # a CPU: no calibration, the CPU default
    assert list(started.phases_s)[-1] == "total"
    decoded = started.model.decode(b'{"inputs": [[1,2,3,4,5,6,7,8], [0,0,0,0,0,0,0,1]]}', "", {})
    outputs = started.model.backend.predict(decoded.items)
    body = orjson.loads(
        orjson.dumps(started.model.encode(outputs, decoded), option=orjson.OPT_SERIALIZE_NUMPY)
    )
    assert body == {
        "object": "list",
        "model": "Doubler",
        "outputs": [[2, 4, 6, 8, 10, 12, 14, 16], [0, 0, 0, 0, 0, 0, 0, 2]],
    }


def test_setup_that_raises_fails_start_up_naming_the_class_and_the_fix() -> None:
    with pytest.raises(StartupError) as info:
        pipeline.start_replica(parse_args({"adapter": f"{HERE}:SetupRaises"}), 0.0)
    msg = info.value.message
    assert f"{HERE}:SetupRaises.setup(cpu) raised FileNotFoundError" in msg
    assert "/models/mine.safetensors" in msg and "fix the model's setup" in msg


def test_wrong_output_count_is_a_500_naming_the_class_with_an_error_id(caplog) -> None:
    backend = backend_of("DropsOne")
    with pytest.raises(UserModelError) as info:
        backend.predict([[1.0] * 8] * 3)
    err = info.value
    assert isinstance(err, InferenceError) and err.status_code == 500
    assert f"{HERE}:DropsOne.predict returned 2 outputs for a batch of 3 inputs" in err.message
    assert f"error id {err.error_id}" in err.message
    assert err.error_id in caplog.text  # the log has it under the same id

    async def request() -> Any:
        raise err

    response = asyncio.run(guarded(request()))  # what the replica answers
    assert response.status_code == 500
    assert orjson.loads(response.body)["error"]["message"] == err.message


def test_an_output_that_is_no_list_is_named() -> None:
    with pytest.raises(UserModelError) as info:
        backend_of("ReturnsDict").predict([[1.0] * 8])
    assert "ReturnsDict.predict returned a dict for a batch of 1 inputs" in info.value.message


def test_predict_that_raises_is_a_500_naming_the_class_not_the_text(caplog) -> None:
    with pytest.raises(UserModelError) as info:
        backend_of("Raises").predict([[1.0] * 8])
    assert f"{HERE}:Raises.predict raised KeyError" in info.value.message
    assert "weights missing" not in info.value.message  # the log has it, not the client
    assert "weights missing a layer" in caplog.text


def test_the_oom_split_sees_a_user_models_out_of_memory_errors() -> None:
    backend = backend_of("OutOfMemoryPast2")
    ooms: list[int] = []
    items = [[float(i)] * 8 for i in range(5)]
    out = predict_with_oom_split(items, backend.predict, is_oom=is_torch_oom, on_oom=ooms.append)
    assert ooms == [5, 3]  # 5 -> halves of 2 and 3; 3 -> 1 and 2
    assert not any(isinstance(o, ItemTooLarge) for o in out)
    assert [row[0] for row in out] == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_decode_request_rejections_are_400s_naming_the_input() -> None:
    model = adapters.build_model(parse_args({"adapter": f"{HERE}:Decoding"}))
    assert model.decode_inline is False  # the user's decoding runs in a thread
    model.backend.setup(torch.device("cpu"))
    decoded = model.decode(b'{"inputs": ["12345678", "00000001"]}', "", {})
    assert model.backend.predict(decoded.items) == [{"sum": 72.0}, {"sum": 2.0}]
    with pytest.raises(Exception) as info:
        model.decode(b'{"inputs": ["12345678", "1234"]}', "", {})
    assert getattr(info.value, "status_code", None) == 400
    assert getattr(info.value, "param", None) == "inputs[1]"
    assert "8 digits" in str(info.value)


def test_example_inputs_give_worst_case_items_and_warm_up_batches() -> None:
    backend = backend_of("WithExamples")
    assert backend.calibrates and backend.describe()["calibrates"] is True
    assert backend.worst_case_items(3) == [[1.0] * 8] * 3
    assert [len(b) for b in backend.warmup_batches(4)] == [1, 2, 4]


def test_without_example_inputs_there_is_nothing_to_calibrate_with() -> None:
    backend = backend_of("Doubler")
    assert not backend.calibrates
    assert backend.worst_case_items(3) == [] and backend.warmup_batches(8) == []


# A GPU partition as calibration's checks read it (on_gpu only: they stop before any device).
GPU = SimpleNamespace(on_gpu=True)


def test_on_a_gpu_a_model_without_example_inputs_needs_max_batch_size() -> None:
    backend = backend_of("Doubler")
    with pytest.raises(ConfigError) as info:
        check_batch_cap_source(parse_args({"adapter": f"{HERE}:Doubler"}), backend, GPU)  # type: ignore[arg-type]
    msg = info.value.message
    assert msg.startswith("args.max_batch_size:") and f"{HERE}:Doubler" in msg
    assert "example_inputs(n)" in msg


def test_with_max_batch_size_calibration_is_skipped_and_says_so(caplog) -> None:
    caplog.set_level("INFO", logger="serve_app")
    args = parse_args({"adapter": f"{HERE}:Doubler", "max_batch_size": 16})
    backend = backend_of("Doubler")
    check_batch_cap_source(args, backend, GPU)  # type: ignore[arg-type]
    assert initial_batch_cap(args, backend, GPU) == BatchCap(16)  # type: ignore[arg-type]
    assert "calibration skipped: the model has no example_inputs(n)" in caplog.text


def test_a_model_with_example_inputs_needs_no_max_batch_size() -> None:
    args = parse_args({"adapter": f"{HERE}:WithExamples"})
    check_batch_cap_source(args, backend_of("WithExamples"), GPU)  # type: ignore[arg-type]


def test_the_calibration_cache_key_changes_with_the_models_source() -> None:
    described = backend_of("Doubler").describe()
    assert described["arch"].startswith(f"{HERE}:Doubler@")
    assert described["adapter"] == f"{HERE}:Doubler" and described["owned_by"] == "user"


def test_graphs_need_collate_forward_and_example_inputs() -> None:
    from serve_app.gpu.graphs import GraphCaptureError

    with pytest.raises(GraphCaptureError) as info:
        backend_of("WithExamples").capture_graphs(8, None, None)  # type: ignore[arg-type]
    assert f"{HERE}:WithExamples has no collate, forward" in str(info.value)


def test_graphs_are_refused_when_forward_is_not_predict() -> None:
    from serve_app.gpu.graphs import GraphCaptureError

    with pytest.raises(GraphCaptureError) as info:
        backend_of("GraphedWrong").capture_graphs(8, None, None)  # type: ignore[arg-type]
    assert "forward(collate(batch)) does not give predict(batch)" in str(info.value)
    # A class whose two paths agree passes the check (the capture itself needs a GPU:
    # tests/gpu/test_custom_model_gpu.py).
    backend_of("Graphed")._check_forward_matches_predict()


def test_example_inputs_that_decode_request_rejects_fail_start_up_naming_them() -> None:
    backend = backend_of("BadExamples")
    with pytest.raises(StartupError) as info:
        backend.worst_case_items(2)
    assert f"{HERE}:BadExamples.example_inputs(2) gave an input" in info.value.message
    assert "8 digits" in info.value.message
