"""A user model's class by import path: imported, checked, built; every failure names the field,
the class and the fix (serve_app.adapters.custom.loader)."""

from __future__ import annotations

import pytest

from serve_app.adapters.custom.loader import instantiate, load_class
from serve_app.errors import ConfigError, StartupError

HERE = "tests.unit.adapters.custom.user_models"


def test_a_class_with_setup_and_predict_loads_with_its_optional_methods() -> None:
    user = load_class(f"{HERE}:Decoding")
    assert user.cls.__name__ == "Decoding"
    assert user.has == {"decode_request", "encode_response"}
    assert load_class(f"{HERE}:WithExamples").has == {"example_inputs"}
    assert len(user.source_digest) == 12
    assert instantiate(user, {"scale": 3.0}).scale == 3.0


@pytest.mark.parametrize(
    ("path", "names"),
    [
        ("nopkg_here.models:Model", ["args.adapter", "nopkg_here", "PYTHONPATH"]),
        (f"{HERE}:Missing", ["args.adapter", "has no attribute 'Missing'", "after the colon"]),
        (f"{HERE}:NOT_A_CLASS", ["args.adapter", "has a int, not a class"]),
        (f"{HERE}:NoPredict", ["args.adapter", "NoPredict lacks predict(self, batch) -> list"]),
        (f"{HERE}:SchemaNotADict", ["args.adapter", "input_schema is a str; make it a dict"]),
    ],
)
def test_what_cannot_be_loaded_is_a_config_error_naming_it(path: str, names: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_class(path)
    for name in names:
        assert name in info.value.message


def test_a_module_that_raises_on_import_is_named(tmp_path, monkeypatch) -> None:
    (tmp_path / "broken_user_model.py").write_text("raise ImportError('needs libfoo')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        load_class("broken_user_model:Model")
    assert "broken_user_model" in info.value.message and "needs libfoo" in info.value.message


def test_options_the_constructor_does_not_take_name_adapter_options() -> None:
    with pytest.raises(ConfigError) as info:
        instantiate(load_class(f"{HERE}:Doubler"), {"sclae": 3.0})
    assert info.value.message.startswith("args.adapter_options:")
    assert "sclae" in info.value.message and "Doubler" in info.value.message


def test_a_constructor_that_raises_fails_start_up_naming_the_class() -> None:
    with pytest.raises(StartupError) as info:
        instantiate(load_class(f"{HERE}:ConstructorRaises"), {})
    assert "ConstructorRaises() raised RuntimeError: no licence key" in info.value.message


def test_a_method_serve_app_cannot_call_with_one_argument_is_named() -> None:
    with pytest.raises(ConfigError) as info:
        instantiate(load_class(f"{HERE}:PredictTakesTwo"), {})
    assert "PredictTakesTwo.predict cannot be called with one argument" in info.value.message
    assert "predict(self, batch) -> list" in info.value.message


def test_the_application_build_checks_the_class_before_any_replica_starts() -> None:
    from serve_app.app import build_app

    with pytest.raises(ConfigError) as info:
        build_app({"adapter": f"{HERE}:NoPredict"})
    assert "NoPredict lacks predict" in info.value.message
    assert build_app({"adapter": f"{HERE}:Doubler"}) is not None


def test_serve_app_check_loads_each_user_class_from_the_working_folder(
    tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    import yaml

    from serve_app.adapters.custom.loader import check_classes
    from serve_app.ops.cli import cmd_check

    (tmp_path / "mymodels.py").write_text(
        "class Good:\n    def setup(self, device): pass\n"
        "    def predict(self, batch): return batch\n"
        "class NoPredict:\n    def setup(self, device): pass\n"
    )

    def config(*adapters: str) -> dict:
        apps = [
            {
                "name": f"a{i}",
                "import_path": "serve_app.app:build_app",
                "route_prefix": f"/a{i}",
                "args": {"adapter": a},
            }
            for i, a in enumerate(adapters)
        ]
        return {"applications": apps}

    doc = config(
        "mymodels:Good", "mymodels:Typo", "mymodels:NoPredict", "elsewhere.pkg:M", "embeddings"
    )
    errors, notes = check_classes(doc, str(tmp_path))
    assert [e.split(":", 1)[0] for e in errors] == [
        "applications[1].args.adapter",
        "applications[2].args.adapter",
    ]
    assert "has no attribute 'Typo'" in errors[0] and "lacks predict" in errors[1]
    assert len(notes) == 1 and notes[0].startswith("applications[3].args.adapter: cannot import")
    assert str(tmp_path) not in sys.path  # the folder is put back as it was
    sys.modules.pop("mymodels", None)
    # the command: run from that folder, a typo fails it and a good class passes
    monkeypatch.chdir(tmp_path)
    for adapters, code in ((["mymodels:Typo"], 2), (["mymodels:Good", "elsewhere.pkg:M"], 0)):
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config(*adapters)))
        assert cmd_check(str(path)) == code
    out = capsys.readouterr()
    assert "has no attribute 'Typo'" in out.err and "its class was not checked here" in out.out
    sys.modules.pop("mymodels", None)
