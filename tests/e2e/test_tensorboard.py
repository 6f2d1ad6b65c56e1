"""End to end: `PetsTrainingClient.tensorboard` (what `kubectl pets tensorboard` runs) over a finished
training's output claim. TensorBoard's own API lists the scalars the trainer logged through Accelerate's
tracker, and headless Chromium (Debian's `chromium`, installed by tests/e2e/chromium.sh when missing)
loads the scalars view: its rendered page names the tags, and its screenshot is kept in
output/e2e-artifacts/tensorboard.png for docs/watching.md."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import urllib.request

import pytest
from polling import wait_for
from trainings import REPO, SMALL_SPEC, Trainings, cluster_kubeconfig

from pets_contract import tracking

pytestmark = pytest.mark.e2e

ARTIFACTS = REPO / "output" / "e2e-artifacts"
# Chromium as docs/watching.md runs it here: no sandbox (root), no GPU, and none of its background
# connections, which a closed network refuses many at a time.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1400,1000", "--virtual-time-budget=20000"]


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        done = subprocess.run([str(REPO / "tests" / "e2e" / "chromium.sh")], text=True, capture_output=True)
        if done.returncode != 0:
            pytest.fail(f"tests/e2e/chromium.sh failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        found = shutil.which("chromium")
    assert found, "chromium is not on PATH after tests/e2e/chromium.sh"
    return found


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


def browse(chromium: str, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, url],
                              text=True, capture_output=True, timeout=120)


def test_tensorboard_serves_a_finished_trainings_scalars_to_a_browser(trainings: Trainings,
                                                                       chromium: str) -> None:
    from pets_client import PetsTrainingClient

    name = "boarded"
    trainings.create(name, {**SMALL_SPEC, "replicas": 1, "epochs": 3})
    status = trainings.wait_phase(name, "Succeeded")
    # Nothing degraded. (status.tracking.ok is there only if a progress read caught the run: TensorBoard
    # alone puts no run id or health in the summary, and 3 short epochs may end between two reads.)
    assert (status.get("tracking") or {}).get("ok") is not False, status.get("tracking")
    assert not [c for c in status["conditions"] if c["type"] == "TrackingDegraded" and c["status"] == "True"]

    pets = PetsTrainingClient(namespace=trainings.namespace, kubeconfig=cluster_kubeconfig())
    with pets.tensorboard(name, port=0) as board:
        assert board.served == [name], (board.served, board.skipped)
        tags: dict[str, object] = {}

        def scalars_listed() -> bool:
            tags.update(get_json(f"{board.url.rstrip('/')}/data/plugin/scalars/tags"))  # type: ignore[arg-type]
            return any(tracking.EVAL_ACCURACY in run_tags for run_tags in tags.values())  # type: ignore[operator]
        wait_for("TensorBoard's scalar tags", scalars_listed, 120, 2)
        logged = set().union(*(set(run_tags) for run_tags in tags.values()))  # type: ignore[call-overload]
        assert {*tracking.STEP_SCALARS, *tracking.EPOCH_SCALARS} <= logged, logged
        accuracy = get_json(f"{board.url.rstrip('/')}/data/plugin/scalars/scalars?"
                            f"tag={tracking.EVAL_ACCURACY}&run={next(iter(tags))}")
        assert len(accuracy) == 3, accuracy  # type: ignore[arg-type]  # one point an epoch

        page = f"{board.url.rstrip('/')}/#timeseries"  # Angular, so its cards are in the DOM Chromium dumps
        dom = browse(chromium, page, "--dump-dom")
        assert dom.returncode == 0, dom.stderr[-2000:]
        assert tracking.EVAL_ACCURACY in dom.stdout, dom.stdout[-3000:]  # the view rendered its cards
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "tensorboard.png"
        shot.unlink(missing_ok=True)
        done = browse(chromium, page, f"--screenshot={shot}")
        assert done.returncode == 0 and shot.stat().st_size > 10_000, (done.stderr[-2000:], shot)
        print(f"TensorBoard at {board.url}: {len(logged)} tags; screenshot {shot} "
              f"({shot.stat().st_size} bytes)")
        pod = board.pod
    # Leaving the `with` deletes the pod.
    wait_for(f"the TensorBoard pod {pod} to go",
             lambda: all(p.metadata.name != pod for p in trainings.core.list_namespaced_pod(
                 trainings.namespace).items), 120, 2)
