"""Self-contained HTML reports of scored manifests."""

from .html import render_report

__all__ = ["render_report"]
