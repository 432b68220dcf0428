"""Errors of a scoring job that are the user's to fix (the CLI prints them in one line and exits 2)."""

from ..errors import CaprewardError


class JobError(CaprewardError):
    """A scoring job that cannot start as asked; the message says what to do instead."""
