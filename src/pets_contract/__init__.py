"""The contract between the trainer, the operator and the client (docs/contract.md), defined once.

Standard library only, so each side imports it without the others' dependencies (no torch, no
kubernetes, no kopf). Every other module reads these tables; none keeps a copy.

- ``env``: the environment a training pod is given, and by whom.
- ``exits``: what a trainer's exit code tells the operator.
- ``gauges``: rank 0's Prometheus gauges, each with its progress.jsonl key and the status field it feeds.
- ``summary``: the keys of the trainer's final summary, and the status fields they set.
- ``goodput``: the totals of status.goodput, where a training's wall time went.
- ``names``: the API's names, the labels and annotations, the output files, the pods' uid.
- ``tracking``: what the trainer logs to TensorBoard and MLflow (scalar tags, run tags, summary keys).
- ``redact``: what every side shows of a URL: never its userinfo or query string, where credentials ride.
"""

# The one source of the version: the package, the images' tags, the chart (a unit test compares) and
# every --version read it. A release changes it here and in Chart.yaml, and adds a CHANGELOG entry.
__version__ = "0.2.0-dev"
