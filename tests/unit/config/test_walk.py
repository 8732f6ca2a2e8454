from serve_app.config.walk import applications, deployments


def test_walk_names_paths_and_skips_entries_that_are_not_mappings():
    doc = {
        "applications": [
            {"deployments": [{"name": "model", "ray_actor_options": {"num_gpus": 0.25}}]},
            "not an application",
            {"name": "rerank", "deployments": [None, {"name": "model"}]},
        ]
    }
    found = [(d.name, d.path, d.actor_options) for d in deployments(doc)]
    assert found == [
        ("default/model", "applications[0].deployments[0]", {"num_gpus": 0.25}),
        ("rerank/model", "applications[2].deployments[1]", {}),
    ]


def test_actor_options_edits_reach_the_config():
    doc = {"applications": [{"deployments": [{"ray_actor_options": {"num_gpus": 1}}]}]}
    for d in deployments(doc):
        d.actor_options["num_gpus"] = 0
    assert doc["applications"][0]["deployments"][0]["ray_actor_options"] == {"num_gpus": 0}


def test_a_config_without_applications_has_no_deployments():
    assert list(deployments({})) == []
    assert list(deployments({"applications": None})) == []


def test_applications_gives_each_mapping_with_its_index_in_the_file():
    doc = {"applications": [{"name": "a"}, "not an application", None, {"name": "b"}]}
    assert [(i, app["name"]) for i, app in applications(doc)] == [(0, "a"), (3, "b")]
