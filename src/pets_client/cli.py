"""`kubectl pets`: the kubectl plugin (kubectl runs `kubectl-pets` from PATH), thin over PetsTrainingClient.

    kubectl pets run -f petstraining.yaml [--watch] [--timeout S] [--data DIR [--claim NAME] [--data-path P]]
    kubectl pets upload DIR --claim NAME [--path P]
    kubectl pets wait NAME [--timeout S]
    kubectl pets logs NAME [--rank N] [-f]
    kubectl pets fetch NAME DIR
    kubectl pets plot NAME [--out FILE]
    kubectl pets tensorboard NAME | --all [--port N] [--image IMAGE] [--timeout S]
    kubectl pets list | delete NAME | suspend NAME | resume NAME

Every command takes -n/--namespace and --kubeconfig (also --context). Exit codes: 0 done (run --watch
and wait: Succeeded), 1 the training Failed or an error, 2 a usage error.

Text that comes from the cluster (status messages, errors, the table's cells) is printed through
errors.terminal_text: no control characters or ESC sequences reach the terminal. `logs` streams the
trainer's log as it is, as `kubectl logs` does.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from ._api import OUTPUT_FILES, __version__
from .errors import PetsClientError, terminal_text
from .progress import final_accuracy


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", default=argparse.SUPPRESS,
                        help="namespace (default: the kubeconfig context's, else default)")
    common.add_argument("--kubeconfig", default=argparse.SUPPRESS,
                        help="kubeconfig file (default: $KUBECONFIG)")
    common.add_argument("--context", default=argparse.SUPPRESS, help="kubeconfig context")
    p = argparse.ArgumentParser(prog="kubectl pets", parents=[common],
                                description="Run and inspect PetsTrainings (training.pets.dev).")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", parents=[common], help="create a PetsTraining from a YAML file")
    run.add_argument("-f", "--filename", required=True, help="PetsTraining manifest (- for stdin)")
    run.add_argument("--name", help="name (default: the manifest's, else generated pets-xxxxx)")
    run.add_argument("-w", "--watch", action="store_true",
                     help="wait with a progress bar; exit 0 on Succeeded, 1 on Failed")
    run.add_argument("--timeout", type=float, help="with --watch: give up after this many seconds")
    run.add_argument("--data", metavar="DIR",
                     help="upload this folder of images first and train on it (spec.dataset)")
    run.add_argument("--claim", help="with --data: the claim to upload into (default: NAME-data)")
    run.add_argument("--data-path", default="/", help="with --data: the directory in the claim (default /)")

    upload = sub.add_parser("upload", parents=[common],
                            help="copy a local folder into a PersistentVolumeClaim (made when missing)")
    upload.add_argument("dir", help="local directory")
    upload.add_argument("--claim", required=True, help="PersistentVolumeClaim name")
    upload.add_argument("--path", default="/", help="directory in the claim (default /)")
    upload.add_argument("--image", help="helper pod image (default: the default trainer image)")
    upload.add_argument("--access-mode", action="append", choices=["ReadWriteOnce", "ReadWriteMany"],
                        help="a new claim's access mode (default ReadWriteMany; repeatable)")
    upload.add_argument("--storage-class", help="a new claim's StorageClass (default: the cluster's default)")

    wait = sub.add_parser("wait", parents=[common], help="watch a training with a progress bar until it ends")
    wait.add_argument("name")
    wait.add_argument("--timeout", type=float, help="give up after this many seconds")

    logs = sub.add_parser("logs", parents=[common], help="the trainer's log of one rank")
    logs.add_argument("name")
    logs.add_argument("--rank", type=int, default=0, help="machine rank (default 0)")
    logs.add_argument("-f", "--follow", action="store_true", help="stream the log")

    fetch = sub.add_parser("fetch", parents=[common],
                           help="copy the outputs from the training's output claim (the managed one by "
                                "default, or spec.output.persistentVolumeClaim; not an emptyDir output)")
    fetch.add_argument("name")
    fetch.add_argument("dir", help="local directory")

    plot = sub.add_parser("plot", parents=[common], help="loss and accuracy curves as a PNG (matplotlib)")
    plot.add_argument("name")
    plot.add_argument("--out", help="PNG file (default: NAME-metrics.png)")

    board = sub.add_parser("tensorboard", parents=[common],
                           help="TensorBoard over a training's output claim, on a local port, until Ctrl-C")
    board.add_argument("name", nargs="?", help="the training (or --all)")
    board.add_argument("--all", action="store_true",
                       help="every training of the namespace that keeps a claim, side by side")
    board.add_argument("--port", type=int, default=6006, help="local port (default 6006; 0: any free one)")
    board.add_argument("--image", help="the pod's image (default: the default trainer image)")
    board.add_argument("--timeout", type=float, default=120.0,
                       help="give up when the pod has not started in this many seconds (default 120)")

    sub.add_parser("list", parents=[common], help="the namespace's PetsTrainings")
    for verb, text in (("delete", "delete a training and its pods"),
                       ("suspend", "suspend a training (its pods go)"),
                       ("resume", "resume a suspended training")):
        sub.add_parser(verb, parents=[common], help=text).add_argument("name")
    return p


def _age(created: str | None) -> str:
    if not created:
        return "?"
    then = datetime.fromisoformat(created.replace("Z", "+00:00"))
    seconds = int((datetime.now(UTC) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def table(items: list[dict[str, Any]]) -> str:
    """`kubectl pets list`: one row per training."""
    rows = [("NAME", "PHASE", "REPLICAS", "EPOCH", "ACCURACY", "AGE")]
    for obj in items:
        st = obj.get("status") or {}
        spec = obj.get("spec") or {}
        epoch = f"{st['epoch']}/{st.get('totalEpochs', spec.get('epochs', '?'))}" if "epoch" in st else "-"
        acc = st.get("evalAccuracy")
        rows.append((obj["metadata"]["name"], st.get("phase") or "-", str(spec.get("replicas", "-")), epoch,
                     f"{acc:.4f}" if isinstance(acc, int | float) else "-",
                     _age(obj["metadata"].get("creationTimestamp"))))
    cells = [[terminal_text(c).replace("\n", " ").replace("\t", " ") for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def _load_manifest(path: str) -> dict[str, Any]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise PetsClientError(f"{path}: expected one PetsTraining document, found {len(docs)}")
    return docs[0]


def _client(args: argparse.Namespace) -> Any:
    from .client import PetsTrainingClient

    return PetsTrainingClient(namespace=getattr(args, "namespace", None),
                              kubeconfig=getattr(args, "kubeconfig", None),
                              context=getattr(args, "context", None))


def _wait(pets: Any, name: str, timeout: float | None) -> int:
    status = pets.wait(name, timeout=timeout, progress=True)
    acc = final_accuracy(status)
    if status.get("phase") == "Succeeded":
        print(f"final accuracy: {acc:.4f}" if acc is not None else "final accuracy: not reported")
        return 0
    print(terminal_text(f"{name} Failed: {status.get('message') or 'no message'}"), file=sys.stderr)
    return 1


def _tensorboard(pets: Any, args: argparse.Namespace) -> int:
    """Serve until Ctrl-C (or SIGTERM), the pod's end or an error; leaving the `with` deletes the pod."""
    if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # raises KeyboardInterrupt
    with pets.tensorboard(None if args.all else args.name, port=args.port, image=args.image,
                          timeout=args.timeout) as board:
        for why in board.skipped:
            print(terminal_text(f"left out: {why}"), file=sys.stderr)
        print(terminal_text(f"TensorBoard of {', '.join(board.served)}: {board.url} (pod {board.pod}; "
                            "Ctrl-C stops it and deletes the pod)"), flush=True)
        board.wait()
    return 0


def run(args: argparse.Namespace) -> int:
    pets = _client(args)
    cmd = args.command
    if cmd == "run":
        data = {"dataset": args.data, "dataset_claim": args.claim, "dataset_path": args.data_path} \
            if args.data else {}
        name = pets.train(_load_manifest(args.filename), name=args.name, **data)
        print(f"petstraining.training.pets.dev/{name} created (namespace {pets.namespace})")
        return _wait(pets, name, args.timeout) if args.watch else 0
    if cmd == "wait":
        return _wait(pets, args.name, args.timeout)
    if cmd == "logs":
        got = pets.logs(args.name, rank=args.rank, follow=args.follow)
        if isinstance(got, str):
            sys.stdout.write(got)
        else:
            for line in got:
                print(line, flush=True)
        return 0
    if cmd == "fetch":
        paths = pets.fetch(args.name, args.dir)
        for path in paths:
            print(path)
        if missing := sorted(set(OUTPUT_FILES) - {p.name for p in paths}):
            print(f"not written (yet): {', '.join(missing)}", file=sys.stderr)
        return 0
    if cmd == "upload":
        result = pets.upload(args.dir, claim=args.claim, path=args.path, image=args.image,
                             access_modes=args.access_mode, storage_class=args.storage_class)
        print(result.summary())
        return 0
    if cmd == "tensorboard":
        return _tensorboard(pets, args)
    if cmd == "plot":
        print(pets.plot(args.name, args.out or f"{args.name}-metrics.png"))
        return 0
    if cmd == "list":
        print(table(pets.list()))
        return 0
    getattr(pets, cmd)(args.name)  # delete, suspend, resume
    past = {"delete": "deleted", "suspend": "suspended", "resume": "resumed"}[cmd]
    print(f"petstraining.training.pets.dev/{args.name} {past}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.command == "run" and not args.data and (args.claim or args.data_path != "/"):
        p.error("--claim and --data-path go with --data DIR")
    if args.command == "tensorboard" and (args.name is None) == (not args.all):
        p.error("tensorboard takes a training's NAME or --all, one of the two")
    try:
        return run(args)
    except PetsClientError as exc:
        print(terminal_text(f"error: {exc}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
