"""The pod contract and the progress contract (docs/contract.md), exercised across the two sides: what the
operator builds is what the trainer reads, and every gauge and summary figure the trainer gives lands in
the status field the contract's table (pets_contract) names."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pets_operator import api, backends, builders, mirror, tracking_status
from pets_operator.plan_types import Observed, Plan, Round
from pets_operator.progress import parse_progress
from pets_operator.spec import Spec
from pets_operator.status_types import Status
from prometheus_client import generate_latest

from pets_contract import gauges
from pets_contract import summary as summary_keys
from pets_contract.env import CONTROLLER_ENV, GPUS, OPERATOR_ENV, OUTPUT_DIR
from pets_training import contract, data, launch, progress
from pets_training.config import resolve

pytestmark = pytest.mark.unit

TARGET = builders.Target("pets", "ns")
NOW = datetime(2026, 1, 2, tzinfo=UTC)
# not the defaults, so a field wired to the wrong variable shows; one extra variable of the user's own
CUSTOM = {
    "replicas": 3,
    "processesPerReplica": 2,
    "masterPort": 29600,
    "mixedPrecision": "bf16",
    "env": [{"name": "HF_HOME", "value": "/cache"}],
}


def _trainer(spec: Spec) -> dict[str, Any]:
    template = builders.pod_template(spec, TARGET)
    (container,) = [c for c in template["spec"]["containers"] if c["name"] == builders.CONTAINER]
    return container


def _pod_env(container: dict[str, Any], cpu: str = "2", index: str = "1") -> dict[str, str]:
    """The environment the kubelet and the Indexed Job controller give the container."""
    env = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            assert var["valueFrom"]["resourceFieldRef"]["resource"] == "limits.cpu", var
            env[var["name"]] = cpu
    env["JOB_COMPLETION_INDEX"] = index
    return env


@pytest.mark.parametrize("overrides", [{}, CUSTOM], ids=["default", "custom"])
def test_the_operator_sets_exactly_the_contract_env(overrides: dict[str, Any]) -> None:
    spec = api.resolve_spec(overrides)
    extras = {var["name"] for var in spec.env or []}
    names = {var["name"] for var in _trainer(spec)["env"]} - extras
    assert names == set(OPERATOR_ENV)


def test_a_pod_given_gpus_also_says_how_many_and_the_trainer_reads_it() -> None:
    spec = api.resolve_spec({**CUSTOM, "resources": {"gpu": 2}})
    container = _trainer(spec)
    names = {var["name"] for var in container["env"]} - {var["name"] for var in spec.env or []}
    assert names == {*OPERATOR_ENV, GPUS}
    assert contract.PodContract.from_env(_pod_env(container)).gpus == 2
    assert contract.PodContract.from_env(_pod_env(_trainer(api.resolve_spec(CUSTOM)))).gpus == 0


def test_the_controllers_variables_are_reserved_from_user_env() -> None:
    assert set(api.RESERVED_ENV) == set(CONTROLLER_ENV)
    assert not set(OPERATOR_ENV) & set(CONTROLLER_ENV)


def test_the_pod_env_and_args_reach_the_launcher_and_the_trainer() -> None:
    spec = api.resolve_spec(CUSTOM)
    container = _trainer(spec)
    env = _pod_env(container)
    env[OUTPUT_DIR] = "/image-default"  # the image's ENV; the operator's --output-dir wins

    pod = contract.PodContract.from_env(env)
    assert (pod.machine_rank, pod.num_machines, pod.procs_per_machine) == (
        1,
        spec.replicas,
        spec.processes_per_replica,
    )
    assert (pod.main_addr, pod.main_port, pod.cpu_limit) == (
        "pets-0.pets.ns.svc.cluster.local",
        spec.master_port,
        2,
    )

    plan = launch.plan_from_env(env, container["args"])
    assert plan.total_processes == spec.replicas * spec.processes_per_replica
    assert plan.mixed_precision == spec.mixed_precision
    command = " ".join(launch.accelerate_command(plan, launch.trainer_args(container["args"]), threads=1))
    assert f"--mixed_precision {spec.mixed_precision}" in command
    assert f"--main_process_ip {pod.main_addr} --main_process_port {spec.master_port}" in command

    cfg = resolve(launch.trainer_args(container["args"]))
    assert cfg.mixed_precision == spec.mixed_precision and cfg.resume
    assert cfg.resolved_output_dir(pod.output_dir) == Path(api.OUTPUT_DIR)
    assert cfg.resolved_checkpoint_dir(pod.output_dir) == Path(builders.checkpoint_dir(spec))
    assert cfg.resolved_checkpoint_dir(pod.output_dir).parent == Path(api.OUTPUT_DIR) / "checkpoints"


def _served_page() -> str:
    """Rank 0's page with every gauge of the contract set, by the trainer's own MetricsServer."""
    server = progress.MetricsServer(0)
    try:
        server.update(progress.epoch_record(3, 5, 0.5, 0.875, 100.0, 60.0, [20.0, 20.0, 20.0]))
        for i, gauge in enumerate(gauges.GAUGES):
            if gauge.key not in server.values:  # set live by the trainer, not per epoch
                server.set(gauge.key, i + 1)
        return generate_latest(server.registry).decode()
    finally:
        server.close()


def test_every_gauge_the_trainer_serves_is_read_checked_and_mirrored() -> None:
    read = parse_progress(_served_page())
    assert set(read) == set(gauges.READ)  # all but the ones served for people (field None)
    typed = Status()
    r = Round(Status(), Observed(backends.JOB, None, progress=read), builders.Target("pets", "ns"), NOW,
              resolved=api.resolve_spec({}))
    mirror.progress(r, Plan(status=typed))  # with the run's goodput entry
    tracking_status.mirror(r, Plan(status=typed))
    status = typed.to_dict()
    (attempt,) = status["goodput"]["attempts"]
    places = {gauges.PROGRESS: status, gauges.DATASET: status["dataset"], gauges.TIME: attempt}
    for gauge in gauges.READ.values():
        if gauge.group == gauges.TRACKING:  # a count of failures: status.tracking.ok is whether it is 0
            assert status["tracking"]["ok"] is (read[gauge.name] == 0), gauge
            continue
        where = places[gauge.group]
        field = str(gauge.field)
        if field.startswith("lastCheckpoint."):
            where, field = status["lastCheckpoint"], field.split(".")[1]
        assert where[field] == gauge.kind(read[gauge.name]), gauge
    assert (status["evalAccuracy"], status["progress"]) == (0.875, f"3/{status['totalEpochs']}")


def test_the_summary_s_final_figures_win_and_its_dataset_report_is_mirrored() -> None:
    report = data.dataset_report("oxford", "/data", ["a", "a", "b"], [("x.txt", "not an image")], 2, 1)
    summary = {"status": "succeeded", "epochs": 5, "final_accuracy": 0.5, "final_train_loss": 0.25,
               "images_per_second": 12.5, "elapsed_seconds": 99.0, "resume_skipped_checkpoints": 2,
               "dataset": data.report_counts(report)}
    assert set(summary_keys.FINAL_FIGURES) <= set(summary)
    typed = Status(eval_accuracy=0.1, steps_total=40, step=39)
    r = Round(Status(), Observed(backends.JOB, None, summary=summary), builders.Target("pets", "ns"), NOW,
              resolved=api.resolve_spec({"epochs": 5}))
    mirror.summary(r, Plan(status=typed))
    status = typed.to_dict()
    assert (status["evalAccuracy"], status["trainLoss"], status["imagesPerSecond"]) == (0.5, 0.25, 12.5)
    assert (status["elapsedSeconds"], status["resumeSkippedCheckpoints"], status["step"]) == (99.0, 2, 40)
    assert status["dataset"] == {"layout": "oxford", "images": 3, "classes": 2, "skipped": 1,
                                 "trainImages": 2, "evalImages": 1}
