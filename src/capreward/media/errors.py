"""Errors raised for bad visual input; every message names the offending item."""

from ..errors import CaprewardError


class MediaError(CaprewardError, ValueError):
    """An image or video that cannot be used, with the item's name and the reason."""

    def __init__(self, item: str, problem: str):
        self.item = item
        self.problem = problem
        super().__init__(f"{item}: {problem}")


class MediaRefused(MediaError):
    """A file the server may not read (outside its media root, or not a regular file there): the
    problem is the one text of every refusal, :data:`~capreward.media.files.REFUSED`."""
