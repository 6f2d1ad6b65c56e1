"""Pods -> why a training waits, why it failed, and what the planner makes of it (status, restarts)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from operator_specs import round_of  # tests/unit/operator/operator_specs.py
from pets_operator import api, backends, builders, pacing, plan_types, pods, stall
from pets_operator import plan as planner
from pets_operator.plan_types import Round
from pets_operator.status_types import Status

from pets_contract import exits

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def pod(
    index: int = 0,
    phase: str = "Pending",
    *,
    scheduled: dict[str, Any] | None = None,
    waiting: str | None = None,
    waiting_message: str = "",
    terminated: dict[str, Any] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    claims: tuple[str, ...] = (),
    **status_extra: Any,
) -> dict[str, Any]:
    conds = list(conditions or [])
    if scheduled is not None:
        conds.append({"type": "PodScheduled", **scheduled})
    cs: dict[str, Any] = {"name": "trainer", "image": "img:1", "state": {}}
    if waiting:
        cs["state"] = {"waiting": {"reason": waiting, "message": waiting_message}}
    if terminated is not None:
        cs["state"] = {"terminated": terminated}
    return {
        "metadata": {
            "name": f"pets-{index}-x",
            "creationTimestamp": "2026-01-02T03:00:00Z",
            "labels": {"job-name": "pets", "batch.kubernetes.io/job-completion-index": str(index)},
        },
        "spec": {
            "nodeName": "node-a",
            "containers": [{"name": "trainer", "image": "img:1"}],
            "volumes": [
                {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)
            ],
        },
        "status": {"phase": phase, "conditions": conds, "containerStatuses": [cs], **status_extra},
    }


UNSCHEDULABLE = {
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/1 nodes are available: 1 Insufficient cpu.",
}
SCHEDULED = {"status": "True"}


# ----------------------------------------------------------------------------- waiting reasons


@pytest.mark.parametrize(
    ("the_pod", "reason", "words"),
    [
        (pod(scheduled=UNSCHEDULABLE), "Unschedulable", "1 Insufficient cpu"),
        (
            pod(
                scheduled=SCHEDULED,
                waiting="ErrImageNeverPull",
                waiting_message='Container image "img:1" is not present with pull policy of Never',
            ),
            "ImagePullFailed",
            "image img:1 cannot be pulled (ErrImageNeverPull)",
        ),
        (pod(scheduled=SCHEDULED, waiting="ImagePullBackOff"), "ImagePullFailed", "ImagePullBackOff"),
        (
            pod(
                scheduled={
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": '0/1 nodes are available: persistentvolumeclaim "no-such-claim" not found.',
                },
                claims=("no-such-claim",),
            ),
            "VolumeNotReady",
            "volume claim no-such-claim",
        ),
        (
            pod(
                scheduled={
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims.",
                },
                claims=("data",),
            ),
            "VolumeNotReady",
            "volume claim data",
        ),
        (
            pod(
                scheduled=SCHEDULED,
                waiting="CreateContainerConfigError",
                waiting_message='secret "s" not found',
            ),
            "ContainerConfigError",
            'secret "s" not found',
        ),
        (pod(scheduled=SCHEDULED, waiting="ContainerCreating"), "ContainerCreating", "being created"),
    ],
)
def test_each_waiting_reason_names_its_cause(the_pod: dict[str, Any], reason: str, words: str) -> None:
    got = pods.waiting_reason(the_pod)
    assert got is not None and got.reason == reason and words in got.message, got


def test_mount_failures_come_from_the_pods_events() -> None:
    creating = pod(scheduled=SCHEDULED, waiting="ContainerCreating")
    events = [{"reason": "FailedMount", "message": "hostPath type check failed: /nope is not a directory"}]
    got = pods.waiting_reason(creating, events)
    assert got == pods.Waiting(
        "VolumeNotReady", "a volume cannot be mounted: hostPath type check failed: /nope is not a directory"
    )


def test_running_and_finished_pods_do_not_wait() -> None:
    assert pods.waiting_reason(pod(phase="Running")) is None
    assert pods.waiting_reason(pod(phase="Succeeded")) is None


def test_the_worst_reason_wins_and_is_counted() -> None:
    gang = [
        pod(0, scheduled=UNSCHEDULABLE),
        pod(1, scheduled=UNSCHEDULABLE),
        pod(2, scheduled=SCHEDULED, waiting="ErrImagePull"),
        pod(3, phase="Running"),
    ]
    worst = pods.worst_waiting(gang)
    assert worst is not None
    waiting, count = worst
    assert waiting.reason == "ImagePullFailed" and count == 1
    assert pods.worst_waiting([pod(0, scheduled=UNSCHEDULABLE), pod(1, scheduled=UNSCHEDULABLE)])[1] == 2
    assert pods.worst_waiting([pod(0, phase="Running")]) is None


# ----------------------------------------------------------------------------- failure causes


def failed(
    index: int, code: int, at: str, *, reason: str = "Error", message: str | None = None, **extra: Any
) -> dict[str, Any]:
    term = {"exitCode": code, "reason": reason, "finishedAt": at}
    if message is not None:
        term["message"] = message
    return pod(index, phase="Failed", terminated=term, **extra)


RANK_OF = backends.JOB.rank_of


def test_the_first_pod_to_fail_is_the_cause_and_its_peers_lost_it() -> None:
    gang = [failed(0, 1, "2026-01-02T03:00:09Z"), failed(1, 137, "2026-01-02T03:00:05Z")]
    f = pods.first_failure(gang, RANK_OF)
    assert f is not None
    assert (f.cause, f.pod, f.rank, f.node, f.exit_code) == ("ExitCode", "pets-1-x", 1, "node-a", 137)
    assert not f.caused_by_cluster and not f.permanent


def test_permanent_exit_code_carries_the_trainers_reason() -> None:
    msg = json.dumps({"status": "failed", "error": "--model resnet9000: not a timm model"})
    f = pods.first_failure(
        [failed(0, exits.PERMANENT, "2026-01-02T03:00:01Z", message=msg)], RANK_OF
    )
    assert f is not None and f.permanent and f.message == "--model resnet9000: not a timm model"


def test_a_pod_whose_dataset_init_container_runs_is_fetching_the_dataset() -> None:
    fetching = {"name": "dataset", "state": {"running": {"startedAt": "2026-01-02T03:00:00Z"}}}
    p = pod(scheduled=SCHEDULED, waiting="PodInitializing", initContainerStatuses=[fetching])
    why = pods.waiting_reason(p)
    assert why is not None and why.reason == "FetchingDataset"
    assert "kubectl logs pets-0-x -c dataset" in why.message
    # a pull failure of the init container's image is worse, and said first
    pulling = {"name": "dataset", "image": "img:1", "state": {"waiting": {"reason": "ErrImagePull"}}}
    assert pods.waiting_reason(pod(scheduled=SCHEDULED, initContainerStatuses=[pulling])).reason == \
        "ImagePullFailed"  # type: ignore[union-attr]
    assert pods.SEVERITY.index("FetchingDataset") < pods.SEVERITY.index("ContainerCreating")


def test_the_dataset_init_containers_permanent_failure_is_the_cause() -> None:
    """spec.dataset.url's initializer failed (a wrong sha256): the trainer never started, its state is
    waiting; the init container's exit 78 and reason are the failure. One that succeeded is not read."""
    msg = json.dumps({"status": "failed", "error": "spec.dataset.sha256: the archive at http://x has sha256 "
                                                   "ab, not the cd the spec expects"})
    init = {"name": "dataset", "state": {"terminated": {"exitCode": 78, "reason": "Error", "message": msg,
                                                        "finishedAt": "2026-01-02T03:00:02Z"}}}
    gang = [pod(0, phase="Failed", waiting="PodInitializing", initContainerStatuses=[init])]
    f = pods.first_failure(gang, RANK_OF)
    assert f is not None and f.permanent and f.exit_code == 78
    assert f.message.startswith("spec.dataset.sha256:")
    done = {"name": "dataset", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    ran = [failed(0, 1, "2026-01-02T03:00:09Z", initContainerStatuses=[done])]
    f = pods.first_failure(ran, RANK_OF)
    assert f is not None and (f.cause, f.exit_code) == ("ExitCode", 1)


def test_a_crash_without_a_message_keeps_the_kubelets_log_tail() -> None:
    logs = "\n".join(f"line {i}" for i in range(30)) + "\n"
    f = pods.first_failure([failed(1, 1, "2026-01-02T03:00:01Z", message=logs)], RANK_OF)
    assert f is not None and f.log_tail == "\n".join(f"line {i}" for i in range(10, 30))
    assert f.message == "exited with code 1"


def test_a_urls_credentials_never_reach_the_failure() -> None:
    """A fetcher that crashed before it could redact (the kubelet's log tail), or a summary quoting the
    URL: neither the userinfo nor the query string of a URL reaches the status."""
    crash = ("Traceback (most recent call last):\nhttp.client.InvalidURL: nonnumeric port: "
             "'https://user:pa55word@host:x/a.tar?X-Amz-Signature=5ig'\n")
    init = {"name": "dataset", "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": crash,
                                                        "finishedAt": "2026-01-02T03:00:02Z"}}}
    f = pods.first_failure([pod(0, phase="Failed", waiting="PodInitializing", initContainerStatuses=[init])],
                           RANK_OF)
    assert f is not None and f.log_tail is not None and "https://REDACTED@host:x/a.tar?REDACTED" in f.log_tail
    assert "pa55word" not in f.log_tail and "5ig" not in f.log_tail
    error = "spec.dataset.url: http://u:pa55word@h/x?sig=5ig refused"
    summary = json.dumps({"status": "failed", "error": error})
    f = pods.first_failure([failed(0, 78, "2026-01-02T03:00:01Z", message=summary)], RANK_OF)
    assert f is not None and f.message == "spec.dataset.url: http://REDACTED@h/x?REDACTED refused"


def test_oom_kill() -> None:
    f = pods.first_failure([failed(1, 137, "2026-01-02T03:00:01Z", reason="OOMKilled")], RANK_OF)
    assert f is not None and f.cause == "OOMKilled" and not f.caused_by_cluster


@pytest.mark.parametrize(
    ("condition_reason", "cause"),
    [
        ("EvictionByEvictionAPI", "Evicted"),
        ("PreemptionByScheduler", "Preempted"),
        ("DeletionByTaintManager", "NodeLost"),
        ("DeletionByPodGC", "NodeLost"),
    ],
)
def test_disruptions_are_the_clusters_doing_even_when_a_peer_failed_first(
    condition_reason: str, cause: str
) -> None:
    peer = failed(0, 1, "2026-01-02T03:00:01Z")
    victim = failed(
        1,
        143,
        "2026-01-02T03:00:05Z",
        conditions=[
            {"type": "DisruptionTarget", "status": "True", "reason": condition_reason, "message": "bye"}
        ],
    )
    f = pods.first_failure([peer, victim], RANK_OF)
    assert f is not None and f.cause == cause and f.caused_by_cluster and f.pod == "pets-1-x"


def test_evicted_by_the_kubelet() -> None:
    f = pods.first_failure(
        [
            failed(0, 137, "2026-01-02T03:00:01Z", reason="Error")
            | {
                "status": {
                    "phase": "Failed",
                    "reason": "Evicted",
                    "message": "The node was low on resource: memory.",
                }
            }
        ],
        RANK_OF,
    )
    assert f is not None and f.cause == "Evicted" and "low on resource" in f.message


def test_no_failed_pod_no_failure() -> None:
    assert pods.first_failure([pod(0, phase="Running")], RANK_OF) is None


# ----------------------------------------------------------------------------- the planner with pods


def body(st: dict[str, Any] | Status | None = None, **spec: Any) -> dict[str, Any]:
    """The stored training; a plan's typed status is stored as the API server would hold it."""
    return {
        "metadata": {"name": "pets", "namespace": "ns", "generation": 1, "uid": "u1"},
        "spec": {"replicas": 2, **spec},
        "status": st.to_dict() if isinstance(st, Status) else st or {},
    }


def job(attempt: int = 0, **st: Any) -> dict[str, Any]:
    j = backends.JOB.build_workload(api.resolve_spec({"replicas": 2}), builders.Target("pets", "ns", attempt))
    j["status"] = st
    return j


def plan(
    b: dict[str, Any],
    workload: dict[str, Any],
    pod_list: list[dict[str, Any]],
    now: datetime = NOW,
    **observed: Any,
) -> plan_types.Plan:
    spec = api.resolve_spec(b["spec"])
    restarts = int((b.get("status") or {}).get("restarts") or 0)
    target = builders.Target("pets", "ns", restarts)
    obs = plan_types.Observed(
        backend=backends.JOB,
        workload=workload,
        service=backends.JOB.build_service(spec, target),
        pods=pod_list,
        **observed,
    )
    return planner.plan(Round.of(b, spec, obs, target, now))


def test_active_job_with_unschedulable_pods_is_pending_with_the_schedulers_words() -> None:
    p = plan(body(), job(active=2), [pod(0, scheduled=UNSCHEDULABLE), pod(1, scheduled=UNSCHEDULABLE)])
    assert p.status.phase == api.PENDING
    assert (
        p.status.message
        == "2/2 pod(s) waiting: unschedulable: 0/1 nodes are available: 1 Insufficient cpu."
    )
    progressing = next(c for c in p.status.conditions if c["type"] == "Progressing")
    assert progressing["reason"] == "Unschedulable"
    assert [e.reason for e in p.events] == ["Unschedulable"]
    # The next poll, same reason: no second Event.
    again = plan(
        body(p.status), job(active=2), [pod(0, scheduled=UNSCHEDULABLE), pod(1, scheduled=UNSCHEDULABLE)]
    )
    assert again.events == [] and again.status.phase == api.PENDING


def test_running_only_when_every_rank_runs() -> None:
    half = plan(
        body(),
        job(active=2),
        [pod(0, phase="Running"), pod(1, scheduled=SCHEDULED, waiting="ContainerCreating")],
    )
    assert half.status.phase == api.PENDING and half.status.message.startswith("1/2 pod(s) waiting")
    full = plan(body(half.status), job(active=2, ready=2), [pod(0, phase="Running"), pod(1, phase="Running")])
    assert full.status.phase == api.RUNNING and full.status.message == "2/2 pods running"
    assert full.status.pending_since is None


def test_pending_timeout_fails_with_the_reason_it_waited_for() -> None:
    waiting = [pod(0, scheduled=UNSCHEDULABLE), pod(1, scheduled=UNSCHEDULABLE)]
    b = body(scheduling={"pendingTimeoutSeconds": 60})
    first = plan(b, job(active=2), waiting)
    assert first.status.pending_since == "2026-01-02T03:04:05Z" and first.requeue_after == 60
    later = plan(
        body(first.status, scheduling={"pendingTimeoutSeconds": 60}),
        job(active=2),
        waiting,
        now=NOW + timedelta(seconds=61),
    )
    assert later.status.phase == api.FAILED
    assert "spec.scheduling.pendingTimeoutSeconds=60" in later.status.message
    assert "Insufficient cpu" in later.status.message
    assert [r["kind"] for r in later.delete] == ["Job"]


def test_suspended_time_does_not_count_towards_the_pending_timeout() -> None:
    suspended = job(active=0)
    suspended["spec"]["suspend"] = True
    b = body(
        {"phase": api.PENDING, "pendingSince": "2026-01-02T03:00:00Z"},
        suspend=True,
        scheduling={"pendingTimeoutSeconds": 60},
    )
    p = plan(b, suspended, [], now=NOW + timedelta(hours=1))
    assert p.status.phase == api.SUSPENDED and p.status.pending_since is None


def failed_job(**extra: Any) -> dict[str, Any]:
    return job(
        failed=1,
        conditions=[
            {
                "type": "Failed",
                "status": "True",
                "reason": extra.pop("reason", "BackoffLimitExceeded"),
                "message": "Job has reached the specified backoff limit",
                "lastTransitionTime": "2026-01-02T03:00:10Z",
            }
        ],
    )


def test_permanent_error_fails_at_once_without_a_restart() -> None:
    msg = json.dumps({"status": "failed", "error": "--model resnet9000: not a timm model"})
    gang = [
        failed(0, exits.PERMANENT, "2026-01-02T03:00:01Z", message=msg),
        failed(1, 1, "2026-01-02T03:00:03Z"),
    ]
    p = plan(body({"phase": api.RUNNING}), failed_job(reason="PodFailurePolicy"), gang)
    assert p.status.phase == api.FAILED and p.status.restarts == 0
    assert p.status.message == "failed: --model resnet9000: not a timm model (a restart cannot fix this)"
    assert p.status.last_failure == {
        "cause": "PermanentError",
        "pod": "pets-0-x",
        "rank": 0,
        "node": "node-a",
        "exitCode": exits.PERMANENT,
        "message": "--model resnet9000: not a timm model",
        "time": "2026-01-02T03:00:01Z",
    }
    assert p.delete == []


def test_a_crash_restarts_the_gang_and_counts() -> None:
    gang = [failed(0, 137, "2026-01-02T03:00:01Z"), failed(1, 1, "2026-01-02T03:00:03Z")]
    p = plan(
        body(
            {"phase": api.RUNNING, "lastCheckpoint": {"epoch": 2, "time": "2026-01-02T02:59:00Z"}},
            output={"persistentVolumeClaim": {"claimName": "out"}},
        ),
        failed_job(),
        gang,
    )
    assert p.status.phase == api.RESTARTING and p.status.restarts == 1
    assert p.status.disruptions is None
    assert "(1/3)" in p.status.message and "checkpoint of epoch 2" in p.status.message
    assert p.status.last_failure["cause"] == "ExitCode" and p.status.last_failure["rank"] == 0


def test_the_clusters_failures_restart_without_counting() -> None:
    evicted = failed(
        1,
        143,
        "2026-01-02T03:00:01Z",
        conditions=[
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "EvictionByEvictionAPI",
                "message": "drain",
            }
        ],
    )
    st = {"phase": api.RUNNING, "restarts": 3, "disruptions": 1}  # 2 counted of maxRestarts 2
    p = plan(body(st, maxRestarts=2), failed_job(), [failed(0, 1, "2026-01-02T03:00:04Z"), evicted])
    assert p.status.phase == api.RESTARTING
    assert p.status.restarts == 4 and p.status.disruptions == 2
    assert "not counted" in p.status.message
    assert "resuming from the newest checkpoint" in p.status.message  # the default output is a claim
    # The same budget spent by a crash instead: Failed.
    crash = plan(body(st, maxRestarts=2), failed_job(), [failed(0, 1, "2026-01-02T03:00:04Z")])
    assert crash.status.phase == api.FAILED and crash.status.conditions
    assert "after 2 counted restart(s)" in crash.status.message


def test_a_rank_stopped_on_sigterm_restarts_without_counting_and_resumes_at_its_step() -> None:
    """Exit 75: the trainer answered a SIGTERM (a deleted pod, a drain) with a step checkpoint. Nobody's
    failure, and the restart resumes at that step, not at the last epoch."""
    summary = {"status": "stopped", "exit_code": 75, "global_step": 37, "checkpoint": "epoch_1_step_12",
               "error": "stopped (SIGTERM received) at global step 37 after saving epoch_1_step_12; "
                        "--resume continues from it"}
    gang = [failed(0, exits.STOPPED, "2026-01-02T03:00:01Z", message=json.dumps(summary)),
            failed(1, exits.STOPPED, "2026-01-02T03:00:01Z")]
    st = {"phase": api.RUNNING, "restarts": 2, "lastCheckpoint": {"epoch": 1}}
    p = plan(body(st, maxRestarts=2), failed_job(), gang, summary=summary)
    assert p.status.phase == api.RESTARTING and p.status.disruptions == 1, p.status.message
    assert p.status.last_failure["cause"] == "Stopped"
    assert p.status.last_failure["lastStep"] == 37  # its summary's, though no step was ever read
    assert "not counted" in p.status.message
    assert "resuming at step 37, from the checkpoint it saved on SIGTERM" in p.status.message


def test_the_work_a_restart_lost_is_counted_once_the_next_attempt_says_where_it_resumed() -> None:
    gang = [failed(0, 137, "2026-01-02T03:00:01Z"), failed(1, 1, "2026-01-02T03:00:03Z")]
    st = {"phase": api.RUNNING, "step": 57, "lastCheckpoint": {"epoch": 2, "step": 48}}
    restarted = plan(body(st), failed_job(), gang)
    failure = restarted.status.last_failure
    assert failure["lastStep"] == 57 and "lostSteps" not in failure  # known once the next attempt runs
    running = [pod(0, phase="Running"), pod(1, phase="Running")]
    after = dict(restarted.status.to_dict(), phase=api.RUNNING)
    p = plan(body(after), job(active=2, attempt=1), running,
             progress={"pets_resume_step": 48.0, "pets_step": 49.0})
    assert p.status.last_failure["lostSteps"] == 9 and p.status.resume_step == 48
    assert [(e.type, e.reason) for e in p.events if e.reason == "WorkLost"] == [("Warning", "WorkLost")]
    (lost,) = [e.message for e in p.events if e.reason == "WorkLost"]
    assert "lost at least 9 step(s): last seen at step 57, the next attempt resumed at step 48" in lost
    again = plan(body(p.status), job(active=2, attempt=1), running,
                 progress={"pets_resume_step": 48.0, "pets_step": 52.0})
    assert not [e for e in again.events if e.reason == "WorkLost"]  # said once
    # An attempt that finished before any progress read: its summary says where it resumed.
    done = job(conditions=[{"type": "Complete", "status": "True"}], attempt=1, succeeded=2)
    finished = plan(body(after), done, [], summary={"status": "succeeded", "epochs": 5, "resume_step": 50})
    assert finished.status.phase == api.SUCCEEDED and finished.status.last_failure["lostSteps"] == 7


def test_last_checkpoint_is_mirrored_from_progress() -> None:
    running = [pod(0, phase="Running"), pod(1, phase="Running")]
    p = plan(body(), job(active=2), running, progress={"pets_checkpoint_epoch": 3.0, "pets_epoch": 3.0})
    assert p.status.last_checkpoint == {"epoch": 3, "time": "2026-01-02T03:04:05Z"}
    same = plan(
        body(p.status),
        job(active=2),
        running,
        progress={"pets_checkpoint_epoch": 3.0},
        now=NOW + timedelta(seconds=10),
    )
    assert same.status.last_checkpoint["time"] == "2026-01-02T03:04:05Z"
    # A step checkpoint mid-epoch 4 moves the step, not the epoch; the next epoch's checkpoint both.
    later = NOW + timedelta(seconds=20)
    mid = plan(body(same.status), job(active=2), running,
               progress={"pets_checkpoint_epoch": 3.0, "pets_checkpoint_step": 41.0}, now=later)
    assert mid.status.last_checkpoint == {"epoch": 3, "step": 41, "time": "2026-01-02T03:04:25Z"}
    next_epoch = plan(body(mid.status), job(active=2), running,
                      progress={"pets_checkpoint_epoch": 4.0, "pets_checkpoint_step": 48.0}, now=later)
    assert next_epoch.status.last_checkpoint == {"epoch": 4, "step": 48, "time": "2026-01-02T03:04:25Z"}


def test_the_dataset_report_is_mirrored_from_progress_then_the_summary() -> None:
    running = [pod(0, phase="Running"), pod(1, phase="Running")]
    gauges = {"pets_dataset_images": 1796.0, "pets_dataset_classes": 10.0, "pets_dataset_skipped": 1.0,
              "pets_dataset_train_images": 1436.0, "pets_dataset_eval_images": 360.0}
    p = plan(body(), job(active=2), running, progress=gauges)
    assert p.status.dataset == {"images": 1796, "classes": 10, "skipped": 1, "trainImages": 1436,
                                   "evalImages": 360}
    done = job(conditions=[{"type": "Complete", "status": "True"}], succeeded=2)
    report = {"layout": "imagefolder", "images": 1796, "classes": 10, "skipped": 2, "train_images": 1436,
              "eval_images": 360}
    finished = plan(body(p.status), done, [], summary={"status": "succeeded", "epochs": 5, "dataset": report})
    assert finished.status.dataset == {"layout": "imagefolder", "images": 1796, "classes": 10,
                                          "skipped": 2, "trainImages": 1436, "evalImages": 360}
    # what the pod wrote is checked: a layout we do not know and counts out of range stay out
    odd = {"layout": "x" * 50, "images": -1, "classes": True, "skipped": 0.5}
    other = plan(body(), done, [], summary={"status": "succeeded", "epochs": 5, "dataset": odd})
    assert other.status.dataset is None


def stall_bound(spec: Any, st: Status) -> float | None:
    return stall.stall_bound(round_of(spec=spec), plan_types.Plan(status=st))


def test_stalled_is_set_and_cleared() -> None:
    running = [pod(0, phase="Running"), pod(1, phase="Running")]
    progress = {"pets_step": 10.0, "pets_elapsed_seconds": 100.0}  # 10 s a step -> bound 200 s
    start = plan(body({"phase": api.RUNNING}), job(active=2), running, progress=progress)
    assert stall_bound(api.resolve_spec({}), start.status) == 200
    stalled_cond = next(c for c in start.status.conditions if c["type"] == "Stalled")
    assert stalled_cond["status"] == "False"
    quiet = plan(
        body(start.status), job(active=2), running, progress=progress, now=NOW + timedelta(seconds=201)
    )
    cond = next(c for c in quiet.status.conditions if c["type"] == "Stalled")
    assert cond["status"] == "True" and "no progress since 2026-01-02T03:04:05Z" in cond["message"]
    assert [e.reason for e in quiet.events] == ["Stalled"]
    moving = plan(
        body(quiet.status),
        job(active=2),
        running,
        progress={"pets_step": 11.0, "pets_elapsed_seconds": 110.0},
        now=NOW + timedelta(seconds=210),
    )
    assert next(c for c in moving.status.conditions if c["type"] == "Stalled")["status"] == "False"


def test_explicit_stall_timeout() -> None:
    explicit = api.resolve_spec({"scheduling": {"stallTimeoutSeconds": 30}})
    assert stall_bound(explicit, Status()) == 30
    assert stall_bound(api.resolve_spec({}), Status()) is None  # no step yet: nothing to measure


def test_unreadable_progress_is_said_once_after_the_grace() -> None:
    running = [pod(0, phase="Running"), pod(1, phase="Running")]
    error = "http://10.0.0.5:9090/metrics: cannot connect: Connection refused"  # scraper._describe
    started = "2026-01-02T03:04:00Z"  # 5 s before NOW: still starting, not flagged
    early = plan(body(), job(active=2), running, progress_error=error, progress_unreachable=True,
                 rank0_running_since=started)
    assert all(c["type"] != "ProgressReported" for c in early.status.conditions)
    later = plan(
        body(early.status),
        job(active=2),
        running,
        progress_error=error,
        progress_unreachable=True,
        rank0_running_since=started,
        now=NOW + timedelta(seconds=30),
    )
    cond = next(c for c in later.status.conditions if c["type"] == "ProgressReported")
    assert cond["status"] == "False" and cond["reason"] == "EndpointUnreachable"
    assert "Connection refused" in cond["message"] and "networkPolicy" in cond["message"]
    assert [e.reason for e in later.events] == ["ProgressUnreadable"]
    again = plan(
        body(later.status),
        job(active=2),
        running,
        progress_error=error,
        progress_unreachable=True,
        rank0_running_since=started,
        now=NOW + timedelta(seconds=40),
    )
    assert again.events == []
    readable = plan(
        body(again.status),
        job(active=2),
        running,
        progress={"pets_step": 3.0},
        rank0_running_since=started,
        now=NOW + timedelta(seconds=50),
    )
    assert (
        next(c for c in readable.status.conditions if c["type"] == "ProgressReported")["status"] == "True"
    )


def next_round(p: plan_types.Plan, poll_active: float = 10.0, watched: bool = True) -> float | None:
    """When pacing says the next round is due after `p` (a Job is watched, a PyTorchJob is not)."""
    backend = backends.JOB if watched else backends.PYTORCHJOB
    pacing.pace(dataclasses.replace(round_of(backend=backend), progress_interval=poll_active), p)
    return p.next_round


def test_a_plans_deadline_only_ever_shortens_the_wait() -> None:
    def running() -> plan_types.Plan:
        return plan_types.Plan(status=Status(phase=api.RUNNING), requeue_after=180.0)  # a stall bound far off

    assert next_round(running()) == 180.0  # a watched Job: no poll, the bound
    assert next_round(plan_types.Plan(status=Status(phase=api.RUNNING))) == pacing.RESYNC
    assert next_round(running(), watched=False) == 10.0  # a PyTorchJob is polled
    assert next_round(plan_types.Plan(status=Status(phase=api.RUNNING), requeue_after=3.0)) == 3.0
    assert next_round(plan_types.Plan(status=Status(phase=api.RESTARTING), requeue_after=0.0)) == 0.5
    assert next_round(plan_types.Plan(status=Status(phase=api.SUCCEEDED), requeue_after=60.0)) == 60.0
    assert next_round(plan_types.Plan(status=Status(phase=api.SUCCEEDED))) is None
    waiting = plan_types.Plan(status=Status(phase=api.PENDING, pending_since="2026-01-02T03:04:05Z"))
    assert next_round(waiting) == 10.0  # mount failures: only in Events
    assert next_round(plan_types.Plan(status=Status(phase=api.PENDING))) == pacing.RESYNC
    assert next_round(plan_types.Plan(status=Status(phase=api.QUEUED))) == pacing.POLL_IDLE


def test_a_rank_that_finished_first_is_not_waiting() -> None:
    ending = [pod(0, phase="Running"), pod(1, phase="Succeeded")]
    p = plan(body({"phase": api.RUNNING}), job(active=1), ending)
    assert p.status.phase == api.RUNNING, p.status.message


def test_only_pods_stuck_creating_need_their_events_read() -> None:
    assert pods.creating(pod(scheduled=SCHEDULED, waiting="ContainerCreating"))
    assert not pods.creating(pod(scheduled=UNSCHEDULABLE))
    assert not pods.creating(pod(phase="Running", scheduled=SCHEDULED))


def done(index: int, finished: str) -> dict[str, Any]:
    return pod(index, phase="Succeeded", terminated={"exitCode": 0, "finishedAt": finished})


def test_every_rank_succeeded_is_success_before_the_job_has_counted_them() -> None:
    running = plan(body({"phase": api.RUNNING}), job(active=2, ready=2),
                   [done(0, "2026-01-02T03:04:01Z"), pod(1, phase="Running")])
    assert running.status.phase == api.RUNNING
    finished = [done(0, "2026-01-02T03:04:01Z"), done(1, "2026-01-02T03:04:03+00:00")]
    p = plan(body({"phase": api.RUNNING}), job(active=2, ready=2), finished)
    assert p.status.phase == api.SUCCEEDED
    succeeded = next(c for c in p.status.conditions if c["type"] == "Succeeded")
    assert succeeded["reason"] == "AllRanksSucceeded"
    assert p.status.completion_time == "2026-01-02T03:04:03Z" and p.status.workload_active is False
    # Any failed pod leaves the verdict to the Job's failure policy.
    failed = [done(0, "2026-01-02T03:04:01Z"), done(1, "2026-01-02T03:04:03Z"),
              pod(1, phase="Failed", terminated={"exitCode": 1})]
    assert plan(body({"phase": api.RUNNING}), job(active=2, ready=2), failed).status.phase == api.RUNNING


def test_all_ranks_succeeded_needs_every_rank() -> None:
    rank = backends.JOB.rank_of
    assert pods.all_ranks_succeeded([done(0, "a"), done(2, "c")], 3, rank) is None
    assert pods.all_ranks_succeeded([done(0, "a"), done(1, "b"), done(2, "c")], 3, rank) == "c"
    assert pods.all_ranks_succeeded([done(0, "")], 1, rank) == ""
