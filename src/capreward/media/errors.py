"""Errors raised for bad visual input; every message names the offending item."""

from ..errors import CaprewardError


class MediaError(CaprewardError, ValueError):
    """An image or video that cannot be used, with the item's name and the reason.

    Args:
        item: what failed, as the message names it (``"image 0 ('a.png')"``).
        problem: why (``"file does not exist"``).

    Examples:
        >>> from capreward.media import MediaError, load_image
        >>> try:
        ...     load_image("missing.png", 3)
        ... except MediaError as exc:
        ...     print(exc.problem, "|", isinstance(exc, ValueError))
        file does not exist | True
    """

    sample_kind = "media"

    def __init__(self, item: str, problem: str):
        self.item = item
        self.problem = problem
        super().__init__(f"{item}: {problem}")


class MediaRefused(MediaError):
    """A file the server may not read (outside its media root, or not a regular file there): the
    problem is the one text of every refusal, :data:`~capreward.media.files.REFUSED`, whatever the
    reason (a client learns nothing about the server's files).

    Examples:
        >>> from capreward.media import MediaError, MediaRefused
        >>> from capreward.media.files import REFUSED
        >>> exc = MediaRefused("image 0", REFUSED)
        >>> isinstance(exc, MediaError), str(exc)
        (True, "image 0: not a file under the server's media root")
    """

    sample_kind = "refused"
