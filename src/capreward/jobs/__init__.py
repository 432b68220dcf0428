"""Offline scoring jobs: manifests in, incremental resumable results out."""
