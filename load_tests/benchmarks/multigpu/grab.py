"""Part "grab": a Ray node per GPU, the headroom controller on, another process takes GPU 1.

Two Ray nodes on this host, started as tests/integration/test_two_nodes.py starts them
(load_tests.harness.ray_nodes): the head with ``CUDA_VISIBLE_DEVICES=0 --num-gpus 1`` and the
worker with ``CUDA_VISIBLE_DEVICES=1 --num-gpus 1``, each labelled ``serve-app/gpu=<its UUID>``.
configs/controller.yaml's application is deployed once per GPU (``gpu0`` at /gpu0, ``gpu1`` at
/gpu1), pinned by ``label_selector``, 1 to 4 replicas of 0.25 each, its policy as in the file
but for shorter cooldowns and bigger steps (POLICY_OVERRIDES, to fit the time limit).
Closed-loop load (harness.load.Load) runs on both from the moment each answers, and scales each
to 4.

Then a separate process takes most of GPU 1's free memory in 1 GiB steps, leaving
``keep_free`` (under the policy's 2 GiB safety margin), holds it and frees it: the harness's
plain-torch hog (load_tests.harness.hog), with ``CUDA_VISIBLE_DEVICES=<GPU 1's UUID>``. On the
CPU, where there is no memory to take, the scripted NVML of GPU 1 is rewritten in steps instead
(the monitors re-read it), which drives the same controller path.

Every 0.5 s a sample (rows.grab_sample): replicas running per GPU (serve.status of each GPU's
application), each GPU's NVML free bytes, the controller's target and reason per application
(monitor.status_snapshot), and the answers since the last sample per application and per GPU
that answered (``x-serve-app-replica`` mapped to a GPU through ``/v1/memory``). Written to
``grab_timeline.json`` as it goes and plotted to ``grab_timeline.png`` at the end (when
matplotlib is installed). Expected: only GPU 1's replicas are shed; GPU 0's serve with 0 errors.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from load_tests.benchmarks.multigpu import rows
from load_tests.benchmarks.multigpu.common import (
    FAKE_TOTAL_BYTES,
    GIB,
    NODE_LABEL,
    cleanup_first,
    failed,
    fake_nvml_doc,
    start_load,
    stop_load,
    write_json,
)
from load_tests.benchmarks.multigpu.timeline import SAMPLE_PERIOD_S, Timeline, plot, running_count
from load_tests.harness import ray_nodes
from load_tests.harness.hog import hog_command
from load_tests.harness.load import Load
from load_tests.harness.meta import ROOT
from load_tests.harness.run import log

CONFIG = ROOT / "configs" / "controller.yaml"
# The file's cooldowns (30 s up, 10 s shed) and one-replica steps would not show a scale-up, a
# shed and a recovery in the time the run has; everything else of its policy is kept.
POLICY_OVERRIDES = {"upscale_cooldown_s": 10, "shed_cooldown_s": 5, "max_step_up": 3}


def grab_config(gpus: list[str], port: int, per_gpu: int, device: str) -> dict[str, Any]:
    """configs/controller.yaml's application once per GPU, pinned to its node by label."""
    from serve_app.config.deploy import load_deploy_config

    base = load_deploy_config(CONFIG)
    apps = []
    for i, uuid in enumerate(gpus):
        app = copy.deepcopy(base["applications"][0])
        app.update(name=f"gpu{i}", route_prefix=f"/gpu{i}")
        app["args"].update(load_format="dummy", dtype="float16")
        dep = app["deployments"][0]
        auto = dep["autoscaling_config"]
        # From min_replicas up under load: with a custom policy Ray 2.60 hands the policy a
        # target of 1 once the first replica runs, so initial_replicas would be undone anyway.
        auto.update(min_replicas=1, max_replicas=per_gpu)
        auto["policy"]["policy_kwargs"].update(POLICY_OVERRIDES)
        opts = dep["ray_actor_options"]
        opts["label_selector"] = {NODE_LABEL: uuid}
        if device == "cpu":
            opts["num_cpus"] = 0.25
            app["args"]["max_batch_size"] = 8
        apps.append(app)
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": apps,
    }


class ScriptedGrab:
    """The CPU's stand-in for the hog: GPU 1's scripted free bytes stepped down to
    ``keep_free_bytes``, held, then restored (the monitors re-read the file on change)."""

    def __init__(self, script: Path, uuid: str, keep_free_bytes: int, hold_s: float):
        self.script, self.uuid, self.keep, self.hold_s = script, uuid, keep_free_bytes, hold_s
        self.report: dict[str, Any] = {"kind": "scripted NVML", "gpu_uuid": uuid}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _set(self, free: int) -> None:
        write_json(self.script, fake_nvml_doc({self.uuid: free}))

    def _run(self) -> None:
        t0 = time.monotonic()
        for frac in (0.75, 0.5, 0.25):
            self._set(int(FAKE_TOTAL_BYTES * frac))
            time.sleep(0.5)
        self._set(self.keep)
        self.report.update(free_while_held_bytes=self.keep, fill_s=round(time.monotonic() - t0, 2))
        time.sleep(max(0.0, self.hold_s - (time.monotonic() - t0)))
        self._set(FAKE_TOTAL_BYTES - GIB)
        self.report["held_s"] = round(time.monotonic() - t0, 2)

    def start(self) -> None:
        self._thread.start()

    def wait(self, timeout_s: float) -> None:
        self._thread.join(timeout=timeout_s)


class HogGrab:
    """load_tests.harness.hog on GPU 1 (plain torch, not a Ray worker): 1 GiB steps until
    ``keep_free`` bytes are left, held until ``hold_s`` from its start, then freed."""

    def __init__(self, uuid: str, keep_free_bytes: int, hold_s: float, log_path: Path):
        self.uuid, self.keep, self.hold_s, self.log_path = uuid, keep_free_bytes, hold_s, log_path
        self.report: dict[str, Any] = {"kind": "torch process", "gpu_uuid": uuid}
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        cmd = hog_command(self.hold_s, self.keep / GIB)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": self.uuid}
        self.proc = subprocess.Popen(
            cmd, cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.report["pid"] = self.proc.pid

    def wait(self, timeout_s: float) -> None:
        assert self.proc is not None
        try:
            out, _ = self.proc.communicate(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            self.proc.kill()  # ours, by pid: exiting frees its memory
            out, _ = self.proc.communicate()
            self.report["killed"] = True
        self.log_path.write_text(out or "")
        lines = [line for line in (out or "").splitlines() if line.startswith("{")]
        self.report.update(
            returncode=self.proc.returncode,
            **(json.loads(lines[-1]) if lines else {"output_tail": (out or "")[-2000:]}),
        )


# ---- the cluster and the scenario ----------------------------------------------------------


class Cluster:
    """A head (GPU 0) and a worker (GPU 1), each its own process group, Ray's files under
    ``scratch`` (so that everything they start names it, for a cleanup by marker)."""

    def __init__(self, scratch: Path, gpus: list[str], cuda: bool, nvml_script: str | None):
        from load_tests.harness.cluster import private_haproxy_files
        from serve_app.ops import ports

        cli = ray_nodes.ray_cli()
        if cli is None:
            raise RuntimeError("the `ray` CLI is not installed beside this Python or on PATH")
        self.cli, self.scratch, self.gpus = cli, scratch, gpus
        private_haproxy_files(scratch)  # HAProxy's files under scratch, private side ports
        fake = {} if cuda else {"SERVE_APP_FAKE_NVML": str(nvml_script)}
        self.envs = [
            ray_nodes.node_env({"CUDA_VISIBLE_DEVICES": str(i), **fake}) for i in range(len(gpus))
        ]
        self.port = ports.free_port()
        self.address = f"127.0.0.1:{ports.free_port()}"
        self.cpus = 8 if cuda else 2  # logical; replicas ask 1 each on a GPU, 0.25 on the CPU
        self.procs: list[subprocess.Popen[bytes]] = []
        self.known: list[int] = []
        self.node_ids: list[str] = []

    def start(self, timeout_s: float) -> float:
        """Start the nodes; seconds taken."""
        t0 = time.monotonic()
        for i, uuid in enumerate(self.gpus):
            where: dict[str, Any] = (
                {"head_port": int(self.address.rsplit(":", 1)[1]), "temp_dir": self.scratch / "ray"}
                if i == 0
                else {"address": self.address}
            )
            cmd = ray_nodes.node_command(
                self.cli, num_cpus=self.cpus, num_gpus=1, labels={NODE_LABEL: uuid}, **where
            )
            log_path = self.scratch / f"node{i}.log"
            self.procs.append(ray_nodes.start_node(cmd, self.envs[i], log_path))
            left = timeout_s - (time.monotonic() - t0)
            self.node_ids = ray_nodes.wait_nodes(self.address, self.envs[0], i + 1, left)
        return time.monotonic() - t0

    def remember_children(self) -> None:
        for p in self.procs:
            self.known += ray_nodes.descendants(p.pid)

    def stop(self) -> None:
        from load_tests.harness.cluster import kill_matching

        for p in reversed(self.procs):
            try:
                ray_nodes.stop_group(p, self.known)
            except Exception as exc:  # noqa: BLE001 - the marker kill below still runs
                log(f"grab: stopping node {p.pid}: {exc!r}")
        kill_matching(str(self.scratch))


def controller_log(ray_dir: Path, limit: int = 300) -> list[str]:
    """The policy's decision lines ("serve_app autoscale gpuN/model: a -> b (reason)") from the
    Serve controller's log, on the head node."""
    lines: list[str] = []
    # session_latest links to the session: each file once
    for path in sorted(
        {p.resolve() for p in ray_dir.glob("session_*/logs/serve/controller_*.log")}
    ):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        lines += [line.strip() for line in text.splitlines() if "serve_app autoscale gpu" in line]
    return lines[-limit:]


def _wait(what: str, ok: Any, until: float, every_s: float = 0.5) -> bool:
    while time.time() < until:
        try:
            if ok():
                return True
        except Exception:  # noqa: BLE001 - not yet
            pass
        time.sleep(every_s)
    log(f"grab: gave up waiting for {what}")
    return False


def _apps(gpus: list[str]) -> list[Any]:
    from ray import serve

    apps = serve.status().applications
    return [apps[f"gpu{i}"] for i in range(len(gpus))]


def _answers(url: str) -> bool:
    return httpx.post(url, json={"input": ["hello"]}, timeout=10.0).status_code == 200


def grab_worker(spec: dict[str, Any]) -> None:
    import ray

    from serve_app.config.deploy import check_deploy_config
    from serve_app.ops import launch

    cuda = spec["device"] == "cuda"
    out_dir = Path(spec["out_dir"])
    path = out_dir / "grab_timeline.json"
    scratch = Path(spec["scratch"]) / "grab"
    scratch.mkdir(parents=True, exist_ok=True)
    gpus, per_gpu = list(spec["gpus"][:2]), int(spec["per_gpu"])
    doc: dict[str, Any] = {
        "schema_version": 1,
        "part": "grab",
        "title": "serve_app headroom controller per GPU: a node per GPU, GPU 1's memory grabbed",
        "status": "running",
        "device": spec["device"],
        "gpu_name": spec.get("gpu_name"),
        "started_at_unix_s": time.time(),
        "replica_gpus": gpus,
        "grabbed_gpu": gpus[1],
        "replicas_per_gpu": per_gpu,
        "clients_per_gpu": spec["clients"],
        "policy_overrides": POLICY_OVERRIDES,
        "sample_period_s": SAMPLE_PERIOD_S,
        "scratch_dir": str(scratch),
        "phases": [],
        "samples": [],
        "notes": [],
        "errors": [],
    }
    if not cuda:
        doc["notes"].append(
            "CPU dry run: logical GPUs (ray start --num-gpus 1 per node) named by a scripted "
            "NVML; gpu_free_bytes are the script's figures, the grab rewrites the script"
        )
    deadline = float(spec["deadline_unix"])
    script = scratch / "nvml.json"
    if not cuda:
        write_json(script, fake_nvml_doc())
    cluster = Cluster(scratch, gpus, cuda, str(script))
    os.environ.update(cluster.envs[0])  # the driver as the head: scripted NVML, HAProxy vars
    loads: dict[str, Load] = {}
    timeline: Timeline | None = None
    grab: HogGrab | ScriptedGrab | None = None
    try:
        doc["nodes_up_s"] = round(cluster.start(min(90.0, deadline - time.time())), 1)
        log(f"grab: two Ray nodes up in {doc['nodes_up_s']} s")
        ray.init(address=cluster.address, namespace="serve_app", log_to_driver=False)
        config = grab_config(gpus, cluster.port, per_gpu, spec["device"])
        doc["serve_config"] = config
        doc["margin_bytes"] = config["applications"][0]["deployments"][0]["autoscaling_config"][
            "policy"
        ]["policy_kwargs"]["safety_margin_bytes"]
        problems = check_deploy_config(config)
        if problems:
            raise ValueError("invalid config: " + "; ".join(problems))
        base = f"http://127.0.0.1:{cluster.port}"
        timeline = Timeline(doc, path, base, loads)
        timeline.phase("deploy")
        timeline.start()
        launch.deploy(config)
        # Load from the moment each application answers: it scales each up to per_gpu.
        for i, uuid in enumerate(gpus):
            url = f"{base}/gpu{i}/v1/embeddings"
            if _wait(f"gpu{i} to answer", lambda u=url: _answers(u), deadline - 60.0):
                loads[uuid] = start_load(url, spec["clients"])

        def all_running() -> bool:
            return all(
                running_count(a.deployments["model"].replica_states) >= per_gpu for a in _apps(gpus)
            )

        need_s = spec["steady_s"] + spec["hold_s"] + 12.0
        if len(loads) < len(gpus):
            raise TimeoutError("time budget: an application never answered")
        if not _wait("all replicas", all_running, deadline - need_s):
            # Grab anyway with what runs: a shed from 2 replicas shows as well as one from 4.
            running = [running_count(a.deployments["model"].replica_states) for a in _apps(gpus)]
            doc["notes"].append(f"grabbed with {running} replicas running, not {per_gpu} each")
            if min(running) < min(2, per_gpu):
                raise TimeoutError(
                    f"time budget: {running} replicas running with {need_s:.0f} s of the "
                    "part's time left for the grab"
                )
        cluster.remember_children()
        doc["deployed_s"] = round(timeline.now(), 1)
        timeline.phase("steady")
        time.sleep(spec["steady_s"])
        timeline.phase("grab")
        keep = int(spec["keep_free_gib"] * GIB)
        hold_s = min(spec["hold_s"], max(5.0, deadline - time.time() - 20.0))
        if cuda:
            grab = HogGrab(gpus[1], keep, hold_s, out_dir / "grab_hog.log")
        else:
            grab = ScriptedGrab(script, gpus[1], keep, hold_s)
        grab.start()
        grab.wait(max(1.0, min(hold_s + 30.0, deadline - time.time())))
        doc["grab"] = grab.report
        timeline.phase("released")
        _wait(
            "GPU 1 back at its replicas",
            lambda: (
                timeline is not None
                and bool(timeline.doc["samples"])
                and timeline.doc["samples"][-1]["replicas_by_gpu"].get(gpus[1], 0) >= per_gpu
            ),
            min(time.time() + spec["release_s"], deadline - 10.0),
        )
        time.sleep(min(2.0, max(0.0, deadline - time.time() - 8.0)))
        timeline.phase("end")
        doc["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 - SIGTERM arrives as SystemExit; recorded
        doc.update(failed(exc, deadline))
        log(f"grab: {doc['status']}: {type(exc).__name__}: {str(exc)[:500]}")
    finally:
        cleanup_first()
        for load in loads.values():
            stop_load(load, timeout_s=5.0)
        if timeline is not None:
            timeline.stop()
        if isinstance(grab, HogGrab) and grab.proc is not None and grab.proc.poll() is None:
            grab.proc.kill()
        doc["load"] = {
            f"gpu{i}": dict(zip(("lost", "failed", "statuses"), loads[u].tally(), strict=True))
            | {"sent": len(loads[u].results)}
            for i, u in enumerate(gpus)
            if u in loads
        }
        doc["verdict"] = rows.grab_verdict(doc["samples"], gpus[1], gpus[0])
        doc["controller_log"] = controller_log(scratch / "ray")
        # A shed decision lasts until the next policy run (0.1 s): the log has every one.
        doc["verdict"]["shed_in_controller_log"] = any(
            "gpu1/" in line and "shed_memory_pressure" in line for line in doc["controller_log"]
        )
        write_json(path, doc)
        plot(doc, out_dir / "grab_timeline.png")
        try:
            ray.shutdown()
        finally:
            cluster.stop()
        write_json(path, doc)
        log(f"grab: {doc['status']}; verdict {doc['verdict']}")
