"""Errors of a scoring job that are the user's to fix (the CLI prints them in one line and exits 2)."""


class JobError(Exception):
    """A scoring job that cannot start as asked; the message says what to do instead."""
