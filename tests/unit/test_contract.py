"""The pod contract and the progress contract (docs/contract.md), checked across the two sides: what the
operator builds is what the trainer reads, and nothing more."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pets_operator import api, builders, goodput, mirror, pods
from pets_operator.progress import parse_progress

from pets_training import contract, data, launch, progress
from pets_training.config import resolve

pytestmark = pytest.mark.unit

TARGET = builders.Target("pets", "ns")
# not the defaults, so a field wired to the wrong variable shows; one extra variable of the user's own
CUSTOM = {
    "replicas": 3,
    "processesPerReplica": 2,
    "masterPort": 29600,
    "mixedPrecision": "bf16",
    "env": [{"name": "HF_HOME", "value": "/cache"}],
}


def _trainer(spec: dict[str, Any]) -> dict[str, Any]:
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
    extras = {var["name"] for var in spec.get("env") or []}
    names = {var["name"] for var in _trainer(spec)["env"]} - extras
    assert names == set(contract.OPERATOR_ENV)


def test_the_controllers_variables_are_reserved_from_user_env() -> None:
    assert set(api.RESERVED_ENV) == set(contract.CONTROLLER_ENV)
    assert not set(contract.OPERATOR_ENV) & set(contract.CONTROLLER_ENV)


def test_the_pod_env_and_args_reach_the_launcher_and_the_trainer() -> None:
    spec = api.resolve_spec(CUSTOM)
    container = _trainer(spec)
    env = _pod_env(container)
    env[contract.OUTPUT_DIR] = "/image-default"  # the image's ENV; the operator's --output-dir wins

    pod = contract.PodContract.from_env(env)
    assert (pod.machine_rank, pod.num_machines, pod.procs_per_machine) == (
        1,
        spec["replicas"],
        spec["processesPerReplica"],
    )
    assert (pod.main_addr, pod.main_port, pod.cpu_limit) == (
        "pets-0.pets.ns.svc.cluster.local",
        spec["masterPort"],
        2,
    )

    plan = launch.plan_from_env(env, container["args"])
    assert plan.total_processes == spec["replicas"] * spec["processesPerReplica"]
    assert plan.mixed_precision == spec["mixedPrecision"]
    command = " ".join(launch.accelerate_command(plan, launch.trainer_args(container["args"]), threads=1))
    assert f"--mixed_precision {spec['mixedPrecision']}" in command
    assert f"--main_process_ip {pod.main_addr} --main_process_port {spec['masterPort']}" in command

    cfg = resolve(launch.trainer_args(container["args"]))
    assert cfg.mixed_precision == spec["mixedPrecision"] and cfg.resume
    assert cfg.resolved_output_dir(pod.output_dir) == Path(api.OUTPUT_DIR)
    assert cfg.resolved_checkpoint_dir(pod.output_dir) == Path(builders.checkpoint_dir(spec))
    assert cfg.resolved_checkpoint_dir(pod.output_dir).parent == Path(api.OUTPUT_DIR) / "checkpoints"


def test_the_trainer_serves_the_gauges_the_operator_reads() -> None:
    assert set(progress.GAUGES) == set(mirror.PROGRESS_FIELDS)
    record = progress.epoch_record(1, 5, 0.5, 0.9, 100.0, 60.0, [60.0])
    keys = {key for key, _ in progress.GAUGES.values()}
    assert set(record) <= keys  # every progress.jsonl key is served
    assert keys - set(record) == {"step", "steps_total", "checkpoint_epoch", "checkpoint_step",
                                       "resume_step", "resume_skipped_checkpoints"}  # set live, not per epoch
    # The run's time split feeds status.goodput: every part the trainer serves is read, by its name.
    assert set(goodput.GAUGE_FIELDS) == set(progress.TRAINER_GAUGES) - {"pets_checkpoint_last_seconds"}
    assert {part for _field, part in goodput.TRAINER_PARTS.values()} == set(progress.TIME_PARTS)
    page = "".join(f"# TYPE {name} gauge\n{name} {i}.5\n" for i, name in enumerate(progress.TRAINER_GAUGES))
    read = parse_progress(page)
    assert read == {name: i + 0.5 for i, name in enumerate(progress.TRAINER_GAUGES) if name in read}
    assert set(read) == set(goodput.GAUGE_FIELDS)
    # The dataset report's counts feed status.dataset, each by its name, from the report's keys.
    assert set(progress.DATASET_GAUGES) == set(mirror.DATASET_FIELDS)
    assert {key for key, _doc in progress.DATASET_GAUGES.values()} == {
        f"dataset_{key}" for key in progress.DATASET_GAUGE_KEYS}
    assert set(progress.DATASET_GAUGE_KEYS) <= set(data.REPORT_COUNTS)
    assert set(progress.DATASET_GAUGE_KEYS) == set(mirror.SUMMARY_DATASET_KEYS)
    page = "".join(f"# TYPE {name} gauge\n{name} {i}\n" for i, name in enumerate(progress.DATASET_GAUGES))
    assert parse_progress(page) == {name: float(i) for i, name in enumerate(progress.DATASET_GAUGES)}


def test_the_permanent_exit_code_is_the_one_the_operator_fails_on() -> None:
    assert contract.PERMANENT_EXIT_CODE == pods.PERMANENT_EXIT_CODE == 78
    assert contract.STOPPED_EXIT_CODE == pods.STOPPED_EXIT_CODE == 75
    assert launch.PERMANENT_EXIT_CODE == contract.PERMANENT_EXIT_CODE
