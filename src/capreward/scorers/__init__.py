"""Scorers: a backbone plus a metric's math plus batching, returning typed per-sample results."""
