"""What the training loggers can hold: MLflow's file store and keys with sub-keys.

MLflow's file store (deprecated in MLflow 3, refused there unless ``MLFLOW_ALLOW_FILE_STORE=true``) writes
each metric to a file named by its key, so it cannot hold a metric (``val/emscore``) beside the sub-scores
named under it (``val/emscore/video/full_f``, the ``/`` of :mod:`capreward.names`). The callbacks check
their loggers before the first step and refuse such a store with one line naming the fix.
"""

from __future__ import annotations


def is_file_store(uri: str | None) -> bool:
    """Whether an MLflow tracking URI is the file store: ``file:...`` or a plain path."""
    uri = str(uri or "")
    return uri.startswith("file:") or (bool(uri) and "://" not in uri and not uri.startswith(("sqlite:", "databricks")))


def file_store_refusal(uri: str, metric_key: str, where: str) -> str:
    """The one-line refusal for a ``where`` (callback) whose ``metric_key`` and its sub-scores would go to
    the MLflow file store at ``uri``."""
    return (
        f"{where} logs each metric and its sub-scores under it ({metric_key} and {metric_key}/video/full_f), which "
        f"MLflow's file store ({uri}) cannot hold (it writes each key as a file path): use a database store, e.g. "
        "tracking URI 'sqlite:///mlflow.db' (MLflow's default), or pass log_sub_scores=False"
    )
