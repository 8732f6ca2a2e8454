"""load_tests.benchmarks.startup.timeline: a cold start's events from a Ray session's logs."""

from __future__ import annotations

from pathlib import Path

from load_tests.benchmarks.startup.timeline import cold_timeline, log_time_s


def test_cold_timeline_from_a_ray_session_folder(tmp_path: Path) -> None:
    """The events a cold row's timeline reads, from log lines as Ray 2.60 writes them."""
    logs = tmp_path / "logs"
    (logs / "serve").mkdir(parents=True)
    day = "2026-12-01 09:32:"

    def write(name: str, *lines: str) -> None:
        (logs / name).write_text("".join(f"{line}\n" for line in lines))

    write("gcs_server.out", f"[{day}30,470 I 1 1] (gcs_server) gcs_server_main.cc:1] start")
    write("python-core-driver-01_1.log", f"[{day}33,350 I 2 2] core_worker.cc:1] connected")
    write("python-core-worker-aa_3.log", f"[{day}33,580 I 3 3] core_worker.cc:1] up")
    write("python-core-worker-bb_4.log", "no time here", f"[{day}35,000 I 4 4] x")
    ctrl = "controller 30492 --"
    write(
        "serve/controller_30492.log",
        f"INFO {day}34,793 {ctrl} Controller starting (version='2.60.0').",
        f"INFO {day}34,864 {ctrl} Deploying new app 'embeddings'.",
        f"INFO {day}37,559 {ctrl} Imported and built app 'embeddings' successfully.",
        f"INFO {day}37,690 {ctrl} Adding 2 replicas to Deployment(name='model', app='e').",
        f"INFO {day}42,636 {ctrl} Replica(id='a') started successfully on node 'n' after 4.9s",
        f"INFO {day}42,901 {ctrl} Replica(id='b') started successfully on node 'n' after 5.2s",
    )
    for rid, start, end in (("a", "40,060", "41,500"), ("b", "40,690", "42,000")):
        write(
            f"serve/replica_e_model_{rid}.log",
            f"INFO {day}{start} e_model {rid} -- Started initializing replica.",
            f"INFO {day}{end} e_model {rid} -- Finished initializing replica.",
        )
    t0 = log_time_s(f"{day}29,250")
    assert t0 is not None
    got = cold_timeline(tmp_path, t0)
    assert got == {
        "ray_gcs_started": 1.22,
        "driver_connected": 4.1,
        "first_worker_started": 4.33,
        "controller_started": 5.543,
        "deploy_received": 5.614,
        "app_built": 8.309,
        "replicas_requested": 8.44,
        "replica_init_started_first": 10.81,
        "replica_init_started_last": 11.44,
        "replica_init_finished_first": 12.25,
        "replica_init_finished_last": 12.75,
        "replica_running_first": 13.386,
        "replica_running_last": 13.651,
    }
    assert cold_timeline(tmp_path / "missing", t0)["controller_started"] is None
