"""spec -> Service and Indexed Job, checked field by field against the pod contract (backends: see
test_operator_backends.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_specs import TARGET, env_of, spec  # tests/unit/operator/operator_specs.py
from pets_operator import api, builders, children

from pets_client import transfer

pytestmark = pytest.mark.unit

def test_defaults_are_the_recipe() -> None:
    s = api.resolve_spec({})
    assert s.replicas == 1 and s.epochs == 5 and s.model == "resnet50d"
    assert s.learning_rate == 0.03 and s.image_size == 224 and s.freeze_backbone is True
    assert s.dataset == {"synthetic": {"imagesPerClass": 20, "numClasses": 37}}
    assert s.output is None and "output" not in s.to_dict()
    assert api.output_of(s) == api.DEFAULT_OUTPUT  # the operator's default chooses
    assert s.resources == {"cpu": "1", "memory": "3Gi", "gpu": 0, "gpuResourceName": "nvidia.com/gpu"}
    assert s.backend == "auto" and s.master_port == 29500 and s.max_restarts == 3


def test_headless_service() -> None:
    svc = children.build_service(spec(), TARGET)
    assert svc["metadata"] == {"name": "pets", "namespace": "team-a",
                               "labels": builders.labels("pets", "rendezvous")}
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {api.LABEL_TRAINING: "pets", api.LABEL_COMPONENT: "trainer"}
    assert {p["port"] for p in svc["spec"]["ports"]} == {29500, 9090}


def test_indexed_job_shape() -> None:
    job = children.build_job(spec(), TARGET)
    js = job["spec"]
    assert job["metadata"]["name"] == "pets"
    assert js["completionMode"] == "Indexed"
    assert js["completions"] == js["parallelism"] == 3
    assert js["backoffLimit"] == 0 and js["suspend"] is False
    pod = js["template"]["spec"]
    assert pod["subdomain"] == "pets" and pod["restartPolicy"] == "Never"
    # Service selects exactly the Job's pods.
    svc = children.build_service(spec(), TARGET)
    assert svc["spec"]["selector"].items() <= js["template"]["metadata"]["labels"].items()
    for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
                "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of"):
        assert key in job["metadata"]["labels"] and key in js["template"]["metadata"]["labels"]


def test_pod_security_context() -> None:
    pod = children.build_job(spec(), TARGET)["spec"]["template"]["spec"]
    # The images' user (image/Dockerfile): above every host user's uid, as checkov's CKV_K8S_40 asks.
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                      "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["automountServiceAccountToken"] is False
    (c,) = pod["containers"]
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                    "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                                    "readOnlyRootFilesystem": True}
    assert c["terminationMessagePath"] == "/dev/termination-log"


@pytest.mark.parametrize("output", [{"emptyDir": {}}, {"persistentVolumeClaim": {"claimName": "out"}}])
def test_the_read_only_root_has_a_volume_wherever_the_trainer_writes(output: dict[str, Any]) -> None:
    """The writable places a 2-process training needs (traced: docs/operator.md, "Security checks"):
    /tmp, the image's HOME (/home/pets: ~/.cache, ~/.config), /dev/shm and /output."""
    pod = children.build_job(spec(output=output), TARGET)["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    vols = {v["name"]: v for v in pod["volumes"]}
    writable = {m["mountPath"]: vols[m["name"]] for m in c["volumeMounts"] if not m.get("readOnly")}
    assert writable["/tmp"] == {"name": "tmp", "emptyDir": {}}
    assert writable["/home/pets"] == {"name": "home", "emptyDir": {}}
    assert writable["/dev/shm"] == {"name": "dshm", "emptyDir": {"medium": "Memory"}}
    assert set(writable) == {"/tmp", "/home/pets", "/dev/shm", "/output"}
    assert ("emptyDir" in writable["/output"]) == ("emptyDir" in output)


def test_pod_contract_env_and_args() -> None:
    (c,) = children.build_job(spec(), TARGET)["spec"]["template"]["spec"]["containers"]
    env = env_of(c)
    assert env["PETS_NUM_MACHINES"] == "3"
    assert env["PETS_PROCS_PER_MACHINE"] == "2"
    assert env["PETS_MAIN_ADDR"] == "pets-0.pets.team-a.svc.example.local"
    assert env["PETS_MAIN_PORT"] == "29500"
    # The recipe travels as flags only (one channel each), not also as environment variables.
    assert not {"PETS_MIXED_PRECISION", "PETS_OUTPUT_DIR", "PETS_CHECKPOINT_DIR"} & set(env)
    assert "PETS_GPUS" not in env  # a CPU pod: the trainer takes CUDA where it works, as before
    assert env["PETS_CPU_LIMIT"] == {
        "resourceFieldRef": {"containerName": "trainer", "resource": "limits.cpu", "divisor": "1"}}
    args = c["args"]
    assert args[args.index("--summary-path") + 1] == "/dev/termination-log"
    assert args[args.index("--metrics-port") + 1] == "9090"
    assert args[args.index("--epochs") + 1] == "5"
    assert args[args.index("--lr") + 1] == "0.03"
    assert args[args.index("--mixed-precision") + 1] == "auto"  # the trainer picks by device
    assert args[args.index("--output-dir") + 1] == "/output"
    assert args[args.index("--data") + 1] == "synthetic"
    # The tutorial's default, passed explicitly so the trainer's own default never decides.
    assert "--pretrained" in args and "--no-pretrained" not in args and "--unfreeze" not in args
    random_init_pod = children.build_job(spec(pretrained=False), TARGET)["spec"]["template"]["spec"]
    (random_init,) = random_init_pod["containers"]
    assert "--no-pretrained" in random_init["args"] and "--pretrained" not in random_init["args"]
    assert c["resources"]["requests"] == c["resources"]["limits"] == {"cpu": "1", "memory": "3Gi"}
    assert c["image"] == api.DEFAULT_IMAGE


def test_restart_attempt_names_and_main_address() -> None:
    t = builders.Target("pets", "ns", attempt=2)
    job = children.build_job(spec(), t)
    assert job["metadata"]["name"] == "pets-r2"
    env = env_of(job["spec"]["template"]["spec"]["containers"][0])
    assert env["PETS_MAIN_ADDR"] == "pets-r2-0.pets.ns.svc.cluster.local"
    assert job["spec"]["template"]["spec"]["subdomain"] == "pets"  # the Service outlives attempts


def test_gpu_pvc_and_scheduling_fields() -> None:
    s = spec(
        resources={"gpu": 2, "cpu": 8, "memory": "32Gi"}, processesPerReplica=2, pretrained=True,
        freezeBackbone=False,
        dataset={"persistentVolumeClaim": {"claimName": "pets-data", "path": "/images"}},
        output={"persistentVolumeClaim": {"claimName": "out", "path": "/run1"}},
        nodeSelector={"gpu": "yes"}, tolerations=[{"key": "gpu", "operator": "Exists"}],
        priorityClassName="high", serviceAccountName="trainer", imagePullSecrets=[{"name": "reg"}],
        image="registry.example/trainer:1", env=[{"name": "HF_HOME", "value": "/output/hf"}],
        activeDeadlineSeconds=600, suspend=True,
    )
    job = children.build_job(s, TARGET)
    assert job["spec"]["activeDeadlineSeconds"] == 600 and job["spec"]["suspend"] is True
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"] == {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"}
    assert env_of(c)["PETS_GPUS"] == "2"  # the trainer fails, saying why, when it finds fewer
    assert c["image"] == "registry.example/trainer:1"
    assert "--pretrained" in c["args"] and "--unfreeze" in c["args"]
    assert c["args"][c["args"].index("--data") + 1] == "/data/images"
    assert c["args"][c["args"].index("--data-layout") + 1] == "auto"  # unset: the trainer detects it
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["data"]["readOnly"] is True and mounts["output"]["subPath"] == "run1"
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["data"]["persistentVolumeClaim"] == {"claimName": "pets-data", "readOnly": True}
    assert vols["output"]["persistentVolumeClaim"] == {"claimName": "out"}
    assert pod["nodeSelector"] == {"gpu": "yes"} and pod["priorityClassName"] == "high"
    assert pod["serviceAccountName"] == "trainer" and pod["imagePullSecrets"] == [{"name": "reg"}]
    assert env_of(c)["HF_HOME"] == "/output/hf"


def test_host_path_dataset() -> None:
    job = children.build_job(spec(dataset={"hostPath": {"path": "/srv/pets"}}), TARGET)
    vols = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert vols["data"]["hostPath"] == {"path": "/srv/pets", "type": "Directory"}


def test_a_dataset_with_no_source_or_two_is_refused_by_resolve_spec_before_any_builder() -> None:
    with pytest.raises(api.SpecError, match=r"spec\.dataset must set exactly one"):
        api.resolve_spec({"dataset": {"synthetic": {}, "hostPath": {"path": "/x"}}})
    with pytest.raises(api.SpecError, match=r"spec\.dataset"):
        api.resolve_spec({"dataset": {}})


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"replicas": 0}, "spec.replicas"),
        ({"epochs": "five"}, "spec.epochs"),
        ({"learningRate": 0}, "spec.learningRate"),
        ({"mixedPrecision": "fp8"}, "spec.mixedPrecision"),
        ({"imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy"),
        ({"dataset": {"hostPath": {"path": "relative"}}}, "spec.dataset.hostPath.path"),
        ({"resources": {"cpu": "lots"}}, "spec.resources.cpu"),
        ({"env": [{"name": "1BAD"}]}, "spec.env[0].name"),
        ({"colour": "blue"}, "spec"),
    ],
)
def test_local_validation_names_the_field(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(api.SpecError) as err:
        api.resolve_spec(bad)
    assert str(err.value).startswith(field), str(err.value)


def test_user_env_cannot_override_the_pod_contract() -> None:
    refused = r"spec\.env\[1\]\.name: Invalid value: .*must not start with PETS_"
    with pytest.raises(api.SpecError, match=refused):
        spec(env=[{"name": "OK", "value": "1"}, {"name": "PETS_MAIN_ADDR", "value": "x"}])
    (c,) = children.build_job(spec(env=[{"name": "OK", "value": "1"}]), TARGET)["spec"]["template"]["spec"][
        "containers"]
    assert c["env"][-1] == {"name": "OK", "value": "1"}


def test_pretrained_cache_is_mounted_read_only_and_passed_as_a_flag() -> None:
    s = spec(pretrainedCache={"persistentVolumeClaim": {"claimName": "hub-cache", "path": "/hf/hub"}})
    pod = children.build_job(s, TARGET)["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    args = c["args"]
    assert "--pretrained" in args
    assert args[args.index("--pretrained-cache") + 1] == "/pretrained-cache/hf/hub"
    claim = {"claimName": "hub-cache", "readOnly": True}
    assert {"name": "pretrained-cache", "persistentVolumeClaim": claim} in pod["volumes"]
    mount = {"name": "pretrained-cache", "mountPath": "/pretrained-cache", "readOnly": True}
    assert mount in c["volumeMounts"]
    weights = children.build_job(spec(weights="/data/w.safetensors"), TARGET)["spec"]["template"]["spec"]
    assert "--pretrained-cache" not in weights["containers"][0]["args"]
    assert all(v["name"] != "pretrained-cache" for v in weights["volumes"])


def test_one_uid_in_the_images_the_pods_and_the_chart() -> None:
    """The images' USER, the trainer pods', the fetch pod's and the chart's operator pod's uid agree, so
    `docker run` and the pods write files the other can read (model.safetensors is 0600)."""
    repo = Path(__file__).resolve().parents[3]
    run_as = builders.RUN_AS
    assert run_as >= 10000  # checkov CKV_K8S_40: above the host's users
    users = re.findall(r"^USER (\S+)$", (repo / "image" / "Dockerfile").read_text(), re.M)
    assert users == [f"{run_as}:{run_as}"] * 2  # operator and trainer stages
    values = yaml.safe_load((repo / "charts" / "pets-training" / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == values["securityContext"]["runAsUser"] == run_as
    assert values["podSecurityContext"]["runAsGroup"] == values["podSecurityContext"]["fsGroup"] == run_as
    assert transfer.FETCH_UID == run_as


# ----------------------------------------------------------------------------- spec.output.managedClaim


def test_managed_output_claim_is_named_after_the_training_and_mounted() -> None:
    s = spec(replicas=2, output={"managedClaim": {}})
    claim = children.build_output_claim(s, TARGET)
    assert claim is not None
    assert claim["metadata"]["name"] == "pets-output" and claim["metadata"]["namespace"] == "team-a"
    assert claim["metadata"]["labels"][api.LABEL_TRAINING] == "pets"
    assert claim["metadata"]["labels"][api.LABEL_OUTPUT_RETENTION] == "Delete"
    # Two pods mount it, maybe on two nodes; 5Gi holds a resnet50d run's two checkpoints and model.
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "5Gi"}}}
    assert children.owned(claim)
    pod = children.build_job(s, TARGET)["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["output"] == {"name": "output", "persistentVolumeClaim": {"claimName": "pets-output"}}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["output"] == {"name": "output", "mountPath": api.OUTPUT_DIR}


def test_render_shows_the_managed_claim_before_the_job() -> None:
    from pets_operator import backends

    kinds = [m["kind"] for m in backends.JOB.children(spec(output={"managedClaim": {}}), TARGET)]
    assert kinds == ["Service", "NetworkPolicy", "PersistentVolumeClaim", "Job"]


@pytest.mark.parametrize(("replicas", "managed", "modes"), [
    (1, {}, ["ReadWriteOnce"]),  # one pod: one node
    (3, {}, ["ReadWriteMany"]),
    (3, {"accessModes": ["ReadWriteOnce"]}, ["ReadWriteOnce"]),  # the user's choice wins
])
def test_managed_output_claim_access_modes(replicas: int, managed: dict[str, Any], modes: list[str]) -> None:
    claim = children.build_output_claim(spec(replicas=replicas, output={"managedClaim": managed}), TARGET)
    assert claim is not None and claim["spec"]["accessModes"] == modes


def test_managed_output_claim_size_class_and_retain() -> None:
    s = spec(output={"managedClaim": {"size": "20Gi", "storageClassName": "fast",
                                      "retentionPolicy": "Retain"}})
    claim = children.build_output_claim(s, TARGET)
    assert claim is not None
    assert claim["spec"]["resources"] == {"requests": {"storage": "20Gi"}}
    assert claim["spec"]["storageClassName"] == "fast"
    # Retain: no owner reference, so deleting the training leaves the claim; found by its label.
    assert claim["metadata"]["labels"][api.LABEL_OUTPUT_RETENTION] == "Retain"
    assert not children.owned(claim)


def test_no_managed_claim_for_other_outputs() -> None:
    assert children.build_output_claim(spec(output={"emptyDir": {}}), TARGET) is None
    own_claim = spec(output={"persistentVolumeClaim": {"claimName": "out"}})
    assert children.build_output_claim(own_claim, TARGET) is None
    assert children.owned(children.build_service(spec(), TARGET))


def test_the_operators_default_output_from_its_flags() -> None:
    assert api.default_output() == {"managedClaim": {"size": "5Gi", "retentionPolicy": "Delete"}}
    assert api.default_output("managedClaim", "20Gi", "fast-rwx") == \
        {"managedClaim": {"size": "20Gi", "retentionPolicy": "Delete", "storageClassName": "fast-rwx"}}
    assert api.default_output("emptyDir", "ignored") == {"emptyDir": {}}
    for args, words in [(("scratch",), "--default-output must be managedClaim or emptyDir, got 'scratch'"),
                        (("managedClaim", "5 Gi"), "--default-output-claim-size must be a Kubernetes "
                                                  "quantity such as 5Gi, got '5 Gi'"),
                        (("managedClaim", "5Gi", "Fast_RWX"), "--default-output-storage-class must be a "
                                                              "StorageClass name, got 'Fast_RWX'")]:
        with pytest.raises(ValueError, match=re.escape(words)):
            api.default_output(*args)


def test_a_url_dataset_is_fetched_by_an_init_container_into_a_shared_cache_claim() -> None:
    s = spec(replicas=2, dataset={"url": "s3://pets/v1", "layout": "imagefolder", "s3": {
        "endpoint": "http://s3.example:7070", "region": "eu-west-1", "credentialsSecret": "s3-keys"}})
    job = children.build_job(s, TARGET)
    pod = job["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (trainer,) = pod["containers"]
    cache = builders.dataset_cache_name(s)
    assert cache.startswith("pets-dataset-") and len(cache) == len("pets-dataset-") + 12
    assert {"name": "data", "persistentVolumeClaim": {"claimName": cache}} in pod["volumes"]
    # the init container writes the cache; the trainer reads its data/ folder, read-only
    assert {"name": "data", "mountPath": "/dataset-cache"} in init["volumeMounts"]
    read = {"name": "data", "mountPath": "/data", "readOnly": True, "subPath": "data"}
    assert read in trainer["volumeMounts"]
    assert init["command"] == ["pets-dataset-init"] and init["image"] == trainer["image"]
    args = init["args"]
    assert args[args.index("--url") + 1] == "s3://pets/v1"
    assert args[args.index("--layout") + 1] == "imagefolder"
    assert args[args.index("--s3-endpoint") + 1] == "http://s3.example:7070"
    assert args[args.index("--credentials-secret") + 1] == "s3-keys"
    assert args[args.index("--cache-size") + 1] == "5Gi"  # the claim's size: the initializer's cap
    sized = children.build_job(spec(dataset={"url": "https://x/a.tar", "cache": {"size": "1Gi"}}), TARGET)
    (sized_init,) = sized["spec"]["template"]["spec"]["initContainers"]
    assert sized_init["args"][sized_init["args"].index("--cache-size") + 1] == "1Gi"
    assert trainer["args"][trainer["args"].index("--data") + 1] == "/data"
    # the keys go to the init container only, from the Secret
    assert {e["name"]: e["valueFrom"]["secretKeyRef"] for e in init["env"]} == {
        "AWS_ACCESS_KEY_ID": {"name": "s3-keys", "key": "AWS_ACCESS_KEY_ID"},
        "AWS_SECRET_ACCESS_KEY": {"name": "s3-keys", "key": "AWS_SECRET_ACCESS_KEY"}}
    assert not any("AWS" in e["name"] for e in trainer["env"])
    assert init["securityContext"] == trainer["securityContext"] and init["resources"] == trainer["resources"]
    # exit 78 of the initializer fails the Job at once, as the trainer's does
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onExitCodes": {"containerName": "dataset", "operator": "In",
                                                 "values": [78]}} in rules
    claim = children.build_dataset_cache_claim(s, TARGET)
    assert claim is not None and claim["metadata"]["name"] == cache
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"] == api.DEFAULT_DATASET_CACHE_SIZE
    assert not children.owned(claim), "the cache outlives the training: the next one on the data reuses it"
    # one cache per source: another digest or endpoint is another claim, the same source the same
    assert builders.dataset_cache_name(spec(dataset={"url": "s3://pets/v1", "s3": {
        "endpoint": "http://s3.example:7070"}})) == cache
    assert builders.dataset_cache_name(spec(dataset={"url": "s3://pets/v1"})) != cache
    plain = spec(dataset={"url": "https://example.com/p.tar.gz", "sha256": "ab" * 32})
    # The names v0.1.0 gave: an upgraded operator adopts the cache a training of the previous release
    # filled (the claim is not owned, so a new name would fetch the data again into a second claim).
    assert (cache, builders.dataset_cache_name(plain)) == ("pets-dataset-5b61b5314240",
                                                           "pets-dataset-8c0accd6b4f0")
    plain_pod = children.build_job(plain, TARGET)["spec"]["template"]["spec"]
    assert "env" not in plain_pod["initContainers"][0]
    assert children.build_dataset_cache_claim(spec(), TARGET) is None
    assert "initContainers" not in children.build_job(spec(), TARGET)["spec"]["template"]["spec"]
