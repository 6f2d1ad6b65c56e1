"""spec.tracking (issue 41): the trainer's flags and env, the rules that refuse a bad one, the digest of a
training from before the field, and status.tracking with the TrackingDegraded condition."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from operator_specs import TARGET, env_of, round_of  # tests/unit/operator/operator_specs.py
from pets_operator import api, backends, builders, plan_types, tracking, tracking_status
from pets_operator import plan as planner
from pets_operator.plan_types import Round
from pets_operator.status_types import Status

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
URI = "http://mlflow.pets-mlflow.svc:5000"
MLFLOW = {"mlflow": {"uri": URI, "experiment": "pets", "credentialsSecret": "mlflow-credentials"}}
RUN_ID = "0123456789abcdef0123456789abcdef"
RUN_URL = f"{URI}/#/experiments/1/runs/{RUN_ID}"


def container(spec: Any, target: builders.Target = TARGET) -> dict[str, Any]:
    return builders.pod_template(spec, target)["spec"]["containers"][0]


# ----------------------------------------------------------------------------- spec -> pod


def test_tensorboard_is_on_by_default_and_mlflow_off() -> None:
    spec = api.resolve_spec({})
    assert spec.tracking == {"tensorboard": True}
    assert tracking.trainer_args(spec) == []
    assert not any(e["name"].startswith(("MLFLOW_", "PETS_TRAINING_")) for e in container(spec)["env"])
    off = api.resolve_spec({"tracking": {"tensorboard": False}})
    assert container(off)["args"][-1] == "--no-tensorboard"
    assert "tracking" not in api.MUTABLE_WHILE_RUNNING  # the flags shape the pods


def test_mlflow_passes_the_server_the_experiment_and_the_secret_s_keys_by_reference() -> None:
    spec = api.resolve_spec({"tracking": MLFLOW})
    target = builders.Target("pets", "team-a", uid="7f1c")
    c = container(spec, target)
    assert c["args"][-4:] == ["--mlflow-uri", URI, "--mlflow-experiment", "pets"]
    env = env_of(c)
    assert (env["PETS_TRAINING_NAMESPACE"], env["PETS_TRAINING_NAME"], env["PETS_TRAINING_UID"]) == \
        ("team-a", "pets", "7f1c")
    for key in tracking.CREDENTIAL_KEYS:  # only references: no value passes through the operator
        assert env[key] == {"secretKeyRef": {"name": "mlflow-credentials", "key": key, "optional": True}}
    assert tracking.CREDENTIAL_KEYS == ["MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                                        "MLFLOW_TRACKING_TOKEN"]
    default = api.resolve_spec({"tracking": {"mlflow": {"uri": URI}}})
    assert default.tracking["mlflow"]["experiment"] == "pets-training"
    assert not any(e["name"].startswith("MLFLOW_") for e in container(default)["env"])


def test_the_trainer_takes_the_flags() -> None:
    from pets_training.config import resolve  # the trainer's own parser and checks: the other side

    cfg = resolve(builders.trainer_args(api.resolve_spec({"tracking": {"tensorboard": False, **MLFLOW}})))
    assert (cfg.mlflow_uri, cfg.mlflow_experiment, cfg.tensorboard) == (URI, "pets", False)


@pytest.mark.parametrize("backend", [backends.JOB, backends.PYTORCHJOB], ids=lambda b: b.name)
def test_every_backend_s_trainers_get_it(backend: backends.Backend) -> None:
    workload = backend.build_workload(api.resolve_spec({"tracking": MLFLOW}), TARGET)
    templates = ([workload["spec"]["template"]] if workload["kind"] == "Job"
                 else [r["template"] for r in workload["spec"]["pytorchReplicaSpecs"].values()])
    for template in templates:
        assert "--mlflow-uri" in template["spec"]["containers"][0]["args"]


def test_the_digest_leaves_out_tracking_at_its_default_so_older_workloads_are_not_rebuilt() -> None:
    plain = api.resolve_spec({})
    before_the_field = {k: v for k, v in plain.to_dict().items() if k != "tracking"}
    assert builders.spec_digest(plain) == builders.spec_digest(before_the_field)
    assert builders.spec_digest(api.resolve_spec({"tracking": MLFLOW})) != builders.spec_digest(plain)
    assert builders.spec_digest(api.resolve_spec({"tracking": {"tensorboard": False}})) != \
        builders.spec_digest(plain)


@pytest.mark.parametrize(("tracking_spec", "extra", "words"), [
    ({"mlflow": {"uri": "http://admin:secret@mlflow:5000"}}, {},
     'spec.tracking.mlflow.uri: Invalid value: "object": spec.tracking.mlflow.uri must not carry'),
    ({"mlflow": {"uri": "mlflow:5000"}}, {}, "spec.tracking.mlflow.uri: 'mlflow:5000' does not match"),
    ({"mlflow": {"uri": URI, "experiment": " "}}, {}, "spec.tracking.mlflow.experiment: ' ' does not match"),
    ({"mlflow": {"uri": URI, "credentialsSecret": "Not_A_Name"}}, {},
     "spec.tracking.mlflow.credentialsSecret: 'Not_A_Name' does not match"),
    ({"mlflow": {"experiment": "pets"}}, {}, "spec.tracking.mlflow: 'uri' is a required property"),
    ({"tensorboard": "yes"}, {}, "spec.tracking.tensorboard: 'yes' is not of type 'boolean'"),
    ({"wandb": {}}, {}, "spec.tracking: Additional properties are not allowed ('wandb' was unexpected)"),
    ({"mlflow": {"uri": URI}}, {"env": [{"name": "MLFLOW_TRACKING_PASSWORD", "value": "x"}]},
     'spec.env: Invalid value: "object": spec.env must not set MLFLOW_TRACKING_URI, '
     "MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_TOKEN when spec.tracking.mlflow"),
])
def test_a_bad_tracking_spec_names_the_field_and_the_value(tracking_spec: dict[str, Any],
                                                           extra: dict[str, Any], words: str) -> None:
    with pytest.raises(api.SpecError) as err:
        api.resolve_spec({"tracking": tracking_spec, **extra})
    assert str(err.value).startswith(words), str(err.value)


def test_mlflow_s_variables_stay_the_user_s_without_spec_tracking_mlflow() -> None:
    spec = api.resolve_spec({"env": [{"name": "MLFLOW_TRACKING_URI", "value": URI}]})  # docs/watching.md
    assert env_of(container(spec))["MLFLOW_TRACKING_URI"] == URI


# ----------------------------------------------------------------------------- status


def summary(**report: Any) -> dict[str, Any]:
    return {"status": "succeeded", "epochs": 5, "tracking": report}


def mirrored(progress: dict[str, float] | None = None, summary_: dict[str, Any] | None = None,
             old: dict[str, Any] | None = None) -> dict[str, Any]:
    st = Status.from_dict({"conditions": [], **(old or {})})
    r = dataclasses.replace(round_of(progress=progress, summary=summary_, now=NOW), meta={"generation": 2})
    tracking_status.mirror(r, plan_types.Plan(status=st))
    return st.to_dict()


def condition(st: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in st["conditions"] if c["type"] == tracking_status.CONDITION), None)


def test_a_run_that_went_well_names_its_id_and_url() -> None:
    st = mirrored(summary_=summary(tensorboard="/output/tensorboard", mlflow_run_id=RUN_ID,
                                   mlflow_url=RUN_URL, ok=True, warning=None))
    assert st["tracking"] == {"mlflowRunId": RUN_ID, "mlflowUrl": RUN_URL, "ok": True}
    c = condition(st)
    assert c is not None and (c["status"], c["reason"]) == ("False", "TrackingOK")


def test_a_server_that_failed_sets_the_condition_with_the_trainer_s_warning_redacted_again() -> None:
    live = mirrored(progress={tracking_status.FAILURES: 1.0})
    c = condition(live)
    assert live["tracking"] == {"ok": False}
    assert c is not None and (c["status"], c["reason"]) == ("True", "TrackingServerFailed")
    warning = "MlflowException: API request to http://bob:hunter2@mlflow:5000/api failed"
    st = mirrored(summary_=summary(mlflow_run_id=None, mlflow_url=None, ok=False, warning=warning), old=live)
    c = condition(st)
    assert st["tracking"]["ok"] is False and "hunter2" not in str(st)
    assert c is not None and c["status"] == "True" and "API request to http://" in c["message"]


def test_a_pod_s_junk_never_reaches_the_status() -> None:
    st = mirrored(summary_=summary(mlflow_run_id="x" * 100, mlflow_url="javascript:alert(1)", ok="yes",
                                   warning=["no"]))
    assert "tracking" not in st and condition(st) is None
    assert mirrored(summary_={"status": "succeeded", "tracking": "broken"}).get("tracking") is None
    with_password = mirrored(summary_=summary(mlflow_run_id=RUN_ID, mlflow_url="http://u:pw@mlflow/#/r"))
    assert with_password["tracking"] == {"mlflowRunId": RUN_ID}


def test_nothing_said_keeps_what_was_said_and_a_new_attempt_keeps_the_run() -> None:
    done = {"tracking": {"mlflowRunId": RUN_ID, "mlflowUrl": RUN_URL, "ok": True}}
    assert mirrored(old=done)["tracking"] == done["tracking"]
    # The attempt after a restart serves its gauge 0: the run's id stays, and no condition flips.
    assert mirrored(progress={tracking_status.FAILURES: 0.0}, old=done)["tracking"] == done["tracking"]
    assert "tracking" not in mirrored(progress={})  # no MLflow, no gauge: nothing at all


def test_the_planner_mirrors_a_succeeded_run() -> None:
    spec = api.resolve_spec({"tracking": MLFLOW})
    target = builders.Target("pets", "ns")
    job = backends.JOB.build_workload(spec, target)
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}
    body = {"metadata": {"name": "pets", "namespace": "ns", "generation": 1, "uid": "u1"},
            "spec": spec.to_dict(), "status": {"phase": api.RUNNING}}
    observed = plan_types.Observed(backend=backends.JOB, workload=job,
                                   summary=summary(mlflow_run_id=RUN_ID, mlflow_url=RUN_URL, ok=True))
    plan = planner.plan(Round.of(body, spec, observed, target, NOW))
    assert plan.status.phase == api.SUCCEEDED
    assert plan.status.tracking["mlflowRunId"] == RUN_ID
