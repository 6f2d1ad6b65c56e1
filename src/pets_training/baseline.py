"""The tutorial's training loop as written (Accelerate's Pets example), the baseline of ``make bench``.

Kept deliberately plain: PIL decoding and ``ToTensor`` in 4 DataLoader workers, float32 (unless
``--mixed-precision``, which the tutorial's ``accelerate launch`` sets), the default memory format,
autograd through the frozen backbone, the model's default thread count, and the plain ``gather`` in
evaluation. Only what the bench needs was added: a step limit, per-step timestamps, the precision as
an option, and random init instead of a hub download (there may be no internet).

    python -m pets_training.baseline --data DIR [--steps N] [--no-eval] [--mixed-precision no|fp16|bf16]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import PIL.Image
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from timm import create_model
from torch.optim.lr_scheduler import OneCycleLR
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import Compose, RandomResizedCrop, Resize, ToTensor


def extract_label(fname: str) -> str:
    stem = fname.split(os.path.sep)[-1]
    match = re.search(r"^(.*)_\d+\.jpg$", stem)
    assert match is not None, stem
    return match.groups()[0]


class PetsDataset(Dataset[dict[str, Any]]):
    def __init__(
        self, file_names: list[str], image_transform: Any = None, label_to_id: dict[str, int] | None = None
    ):
        self.file_names = file_names
        self.image_transform = image_transform
        self.label_to_id = label_to_id

    def __len__(self) -> int:
        return len(self.file_names)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        fname = self.file_names[idx]
        raw_image = PIL.Image.open(fname)
        image = raw_image.convert("RGB")
        if self.image_transform is not None:
            image = self.image_transform(image)
        label: Any = extract_label(fname)
        if self.label_to_id is not None:
            label = self.label_to_id[label]
        return {"image": image, "label": label}


def training_function(
    config: dict[str, Any],
    data_dir: str,
    max_steps: int | None = None,
    run_eval: bool = True,
    step_hook: Callable[[int, int], None] | None = None,
    mixed_precision: str = "no",
) -> None:
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision=mixed_precision)
    lr = config["lr"]
    num_epochs = int(config["num_epochs"])
    seed = int(config["seed"])
    batch_size = int(config["batch_size"])
    image_size = config["image_size"]
    if not isinstance(image_size, list | tuple):
        image_size = (image_size, image_size)

    file_names = [os.path.join(data_dir, fname) for fname in os.listdir(data_dir) if fname.endswith(".jpg")]
    all_labels = [extract_label(fname) for fname in file_names]
    id_to_label = sorted(set(all_labels))
    label_to_id = {lbl: i for i, lbl in enumerate(id_to_label)}

    set_seed(seed)
    np.random.seed(seed)
    random_perm = np.random.permutation(len(file_names))
    cut = int(0.8 * len(file_names))
    train_split = random_perm[:cut]
    eval_split = random_perm[cut:]

    train_tfm = Compose([RandomResizedCrop(image_size, scale=(0.5, 1.0)), ToTensor()])
    train_dataset = PetsDataset([file_names[i] for i in train_split], train_tfm, label_to_id)
    eval_tfm = Compose([Resize(image_size), ToTensor()])
    eval_dataset = PetsDataset([file_names[i] for i in eval_split], eval_tfm, label_to_id)

    train_dataloader = DataLoader(train_dataset, shuffle=True, batch_size=batch_size, num_workers=4)
    eval_dataloader = DataLoader(eval_dataset, shuffle=False, batch_size=batch_size, num_workers=4)

    num_classes = len(label_to_id)
    model: Any = create_model(config.get("model", "resnet50d"), pretrained=False, num_classes=num_classes)
    model = model.to(accelerator.device)
    for param in model.parameters():
        param.requires_grad = False
    for param in model.get_classifier().parameters():
        param.requires_grad = True

    mean = torch.tensor(model.default_cfg["mean"])[None, :, None, None].to(accelerator.device)
    std = torch.tensor(model.default_cfg["std"])[None, :, None, None].to(accelerator.device)

    optimizer = torch.optim.Adam(params=model.parameters(), lr=lr / 25)
    lr_scheduler = OneCycleLR(
        optimizer=optimizer, max_lr=lr, epochs=num_epochs, steps_per_epoch=len(train_dataloader)
    )
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    step_count = 0
    for epoch in range(num_epochs):
        model.train()
        for batch in train_dataloader:
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}
            inputs = (batch["image"] - mean) / std
            outputs = model(inputs)
            loss = torch.nn.functional.cross_entropy(outputs, batch["label"])
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            step_count += 1
            if step_hook is not None:
                step_hook(step_count, batch["label"].shape[0] * accelerator.num_processes)
            if max_steps is not None and step_count >= max_steps:
                break
        if run_eval:
            model.eval()
            accurate = 0
            num_elems = 0
            for batch in eval_dataloader:
                batch = {k: v.to(accelerator.device) for k, v in batch.items()}
                inputs = (batch["image"] - mean) / std
                with torch.no_grad():
                    outputs = model(inputs)
                predictions = outputs.argmax(dim=-1)
                accurate_preds = accelerator.gather(predictions) == accelerator.gather(batch["label"])
                num_elems += accurate_preds.shape[0]
                accurate += accurate_preds.long().sum().item()
            accelerator.print(f"epoch {epoch}: {100 * accurate / num_elems:.2f}")
        if max_steps is not None and step_count >= max_steps:
            break


def main() -> int:
    parser = argparse.ArgumentParser(description="The tutorial's Pets training loop, as written.")
    parser.add_argument("--data", required=True, help="directory of <label>_<n>.jpg images")
    parser.add_argument("--model", default="resnet50d")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None, help="stop after this many training steps")
    parser.add_argument("--no-eval", action="store_true")
    parser.add_argument("--mixed-precision", choices=["no", "fp16", "bf16"], default="no",
                        help="what the tutorial's `accelerate launch --mixed_precision` sets (default: no, "
                             "the script as written)")
    args = parser.parse_args()
    config = {
        "lr": 3e-2,
        "num_epochs": args.epochs,
        "seed": 42,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "model": args.model,
    }
    times: list[float] = []
    images: list[int] = []

    def hook(step: int, n: int) -> None:
        times.append(time.perf_counter())
        images.append(n)

    start = time.perf_counter()
    training_function(config, args.data, args.steps, not args.no_eval, hook, args.mixed_precision)
    print("RESULT " + json.dumps({"start": start, "step_times": times, "step_images": images}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
