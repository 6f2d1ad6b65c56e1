"""The input pipeline (``pets_training.inputs``, ``pets_training.workers``): the preloaded forkserver the
workers fork from and what they import, the eval shards and the eval store (batches of the training
batch's shape, padding masked, every sample counted once), and the padding of a short training batch."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator

from pets_training.data import build_data
from pets_training.inputs import (
    PAD_LABEL,
    EvalStoreBuild,
    build_eval_store,
    eval_shard,
    evaluate,
    pad_batch,
    start_worker_server,
)
from pets_training.model import create_model, trainable_module
from pets_training.train import Normalise

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("n", [1, 7, 9, 160, 1478])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("batch_size", [1, 4, 128])
def test_the_shards_cover_the_set_once_in_batches_of_one_shape(n: int, world: int, batch_size: int) -> None:
    if n < world:
        return  # check_fits_world refuses it
    seen: list[int] = []
    plans = set()
    for rank in range(world):
        indices, batch, batches = eval_shard(n, rank, world, batch_size)
        assert batch == batch_size and len(indices) <= batch * batches  # the training batch's shape
        assert batch * batches - math.ceil(n / world) < batch  # under one batch of padding
        seen += indices
        plans.add((batch, batches))
    assert sorted(seen) == list(range(n))
    assert len(plans) == 1  # every process runs as many batches of one shape


def test_the_store_holds_the_eval_transform_of_its_shard_padded_and_masked() -> None:
    data = build_data("synthetic", 32, 42, 0.8, 3, 15)  # 9 eval images
    store = build_eval_store(data.eval, 3, 1, 2, 0, torch.device("cpu"))  # rank 1 of 2: images 1, 3, 5, 7
    # rank 0's shard has 5: two batches of 3 on every rank, the training batch's shape
    assert len(store) == 2 and store.samples == 4
    assert {tuple(t.shape) for t in store.images} == {(3, 3, 32, 32)}
    assert [v.tolist() for v in store.valid] == [[True] * 3, [True, False, False]]
    for position, index in enumerate([1, 3, 5, 7]):
        image, label = data.eval[index]
        batch, row = divmod(position, 3)
        assert torch.equal(store.images[batch][row], image) and int(store.labels[batch][row]) == label
    assert store.images[0].dtype == torch.uint8 and store.nbytes == 2 * 3 * 3 * 32 * 32


def test_a_short_training_batch_is_padded_with_its_own_images_left_out_of_the_loss() -> None:
    images = torch.arange(3 * 2 * 1 * 1, dtype=torch.uint8).view(3, 2, 1, 1)
    labels = torch.tensor([4, 5, 6])
    padded, padded_labels = pad_batch(images, labels, 8)
    assert padded.shape == (8, 2, 1, 1) and padded_labels.tolist() == [4, 5, 6] + [PAD_LABEL] * 5
    assert torch.equal(padded[3:], images[[0, 1, 2, 0, 1]])
    logits = torch.randn(8, 7)
    assert torch.equal(F.cross_entropy(logits, padded_labels, reduction="sum", ignore_index=PAD_LABEL),
                       F.cross_entropy(logits[:3], labels, reduction="sum"))
    assert pad_batch(images, labels, 3) == (images, labels)  # a whole batch: as it is


def test_workers_from_the_preloaded_forkserver_build_the_same_store() -> None:
    """The forkserver has torch loaded (the workers fork with it, nothing imported again) and one thread
    (a fork copies no lock of another thread), and workers give the store made without them."""
    from multiprocessing import forkserver

    start_worker_server()
    data = build_data("synthetic", 32, 42, 0.8, 3, 40)  # 24 eval images
    here = build_eval_store(data.eval, 4, 0, 1, 0, torch.device("cpu"))
    workers = build_eval_store(data.eval, 4, 0, 1, 2, torch.device("cpu"))
    early = EvalStoreBuild(data.eval, 4, 0, 1, 2, torch.device("cpu"))
    early.start()  # as after the first training step: the workers decode ahead, collected later
    for other in (workers, early.collect()):
        assert all(torch.equal(a, b) for a, b in zip(here.images, other.images, strict=True))
        assert all(torch.equal(a, b) for a, b in zip(here.labels, other.labels, strict=True))
        assert [v.tolist() for v in here.valid] == [v.tolist() for v in other.valid]
    server = Path(f"/proc/{forkserver._forkserver._forkserver_pid}")  # type: ignore[attr-defined]
    assert "libtorch_cpu" in (server / "maps").read_text()
    assert len(os.listdir(server / "task")) == 1


def test_evaluate_counts_every_image_once_as_a_plain_loop_does() -> None:
    data = build_data("synthetic", 32, 42, 0.8, 3, 15)  # 9 eval images: 2 batches of 5, 1 padded
    accelerator = Accelerator(cpu=True)
    model = create_model("resnet10t", data.num_classes)
    module = accelerator.prepare(trainable_module(model, unfreeze=False))
    normalise = Normalise(model, accelerator.device, channels_last=False)
    store = build_eval_store(data.eval, 5, 0, 1, 0, accelerator.device)
    assert [int(v.sum()) for v in store.valid] == [5, 4]
    correct, counted = evaluate(module, store, accelerator, normalise)
    module.eval()
    with torch.no_grad():
        expected = sum(
            int(module(normalise(image[None])).argmax(dim=-1).item() == label)
            for image, label in (data.eval[i] for i in range(len(data.eval)))
        )
    assert (correct, counted) == (expected, 9)


KILLED_TRAINER = """
import os, signal, sys
from multiprocessing import forkserver
from torch.utils.data import DataLoader
from pets_training.data import build_data
from pets_training.inputs import start_worker_server, worker_options

if __name__ == "__main__":
    start_worker_server()
    data = build_data("synthetic", 32, 42, 0.8, 3, 10)
    loader = DataLoader(data.train, batch_size=4, persistent_workers=True, **worker_options(2, False))
    running = iter(loader)
    next(running)
    pids = [w.pid for w in running._workers] + [forkserver._forkserver._forkserver_pid]
    print(" ".join(map(str, pids)), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_workers_and_their_forkserver_exit_when_the_training_process_is_killed(tmp_path: Path) -> None:
    """A SIGKILL gives the trainer no chance to stop its workers, whose parent is the forkserver: they
    watch the trainer and exit, and the forkserver with them (before, both stayed, 1.4 GB each pair)."""
    import subprocess
    import sys
    import time

    script = tmp_path / "killed.py"
    script.write_text(KILLED_TRAINER)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-3000:]
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 3
    deadline = time.monotonic() + 30  # a bound, not a timing: they poll once a second
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    for pid in left:  # do not leak them even when the test fails
        os.kill(pid, 9)
    assert not left


KILLPG = """
import os, signal
from torch.utils.data import DataLoader
from pets_training.inputs import start_worker_server, worker_options

asked = []
signal.signal(signal.SIGTERM, lambda *_: asked.append(1))  # the rank's own: finish the step, save
start_worker_server()
loader = DataLoader(list(range(64)), batch_size=4, persistent_workers=True, **worker_options(1, False))
batches = iter(loader)
assert next(batches).tolist() == [0, 1, 2, 3]
os.killpg(os.getpgid(0), signal.SIGTERM)  # as torchrun stops a rank
rest = [int(x) for batch in batches for x in batch]
assert asked and rest == list(range(4, 64)), (asked, rest)
print("read the whole epoch after the SIGTERM")
"""


def test_a_worker_outlives_a_sigterm_to_its_ranks_process_group() -> None:
    """torchrun sends SIGTERM to each rank's process group while the rank finishes its step and saves; a
    DataLoader worker in that group would die, failing the batch the rank is reading. The rank, in a
    session of its own here, signals its group, reads the rest of the epoch, and exits (no hang)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", KILLPG], capture_output=True, text=True, timeout=120,
                          start_new_session=True)
    assert proc.returncode == 0 and "read the whole epoch" in proc.stdout, proc.stdout + proc.stderr[-3000:]


WORKER_SIDE = """
import sys
from pets_training.workers import WORKER_PRELOAD
for name in WORKER_PRELOAD:
    __import__(name)
print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] in ("accelerate", "timm"))) or "none")
"""

PROBE = """
import os, sys, time

TICK = os.sysconf("SC_CLK_TCK")


def collate(batch):
    \"\"\"In the worker: what it has imported, and the seconds since it started.\"\"\"
    with open(f"/proc/{os.getpid()}/stat") as f:
        started = int(f.read().rsplit(")", 1)[1].split()[19]) / TICK
    heavy = [m for m in sys.modules if m.split(".")[0] in ("accelerate", "timm")]
    heavy += [m for m in sys.modules if m == "pets_training.inputs"]
    return sorted(heavy), time.clock_gettime(time.CLOCK_BOOTTIME) - started
"""

FIRST_BATCH = """
from torch.utils.data import DataLoader
from pets_training.data import build_data
from pets_training.workers import start_worker_server, worker_options
import probe

start_worker_server()
warm = DataLoader(list(range(8)), batch_size=4, **worker_options(1, False))
next(iter(warm))  # the forkserver has imported its preload
data = build_data("synthetic", 32, 42, 0.8, 3, 10)
for _ in range(3):  # fresh workers, as each loader of a run starts them
    heavy, seconds = next(iter(DataLoader(data.train, batch_size=4, collate_fn=probe.collate,
                                          **worker_options(1, False))))
    print(" ".join(heavy) or "none", f"{seconds:.2f}")
"""


def test_the_worker_side_modules_do_not_import_accelerate() -> None:
    """What the forkserver preloads is all a worker unpickles; accelerate (and timm) stay out of it."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", WORKER_SIDE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["none"], proc.stdout + proc.stderr[-3000:]


def test_a_workers_first_batch_comes_without_imports(tmp_path: Path) -> None:
    """A worker forked from the preloaded forkserver unpickles its init function and dataset without
    importing accelerate, timm or the loader's module, and hands over its first batch soon after it starts
    (about 0.2 s on this machine; the bound is loose, for a loaded machine: an import of torch is 3 s)."""
    import subprocess
    import sys

    (tmp_path / "probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", FIRST_BATCH], capture_output=True, text=True, timeout=180,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.split() for line in proc.stdout.splitlines()]
    assert len(lines) == 3 and all(heavy == "none" for heavy, _ in lines), proc.stdout
    assert min(float(seconds) for _, seconds in lines) < 1.5, proc.stdout
