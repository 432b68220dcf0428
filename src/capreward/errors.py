"""capreward's error model: one root exception for every error the package raises.

Every exception class capreward defines derives from :class:`CaprewardError`, and from the builtin
class it derived from before the root existed (a :class:`~capreward.media.MediaError` is still a
``ValueError``, a :class:`~capreward.hub.ModelNotAvailable` still an ``OSError``), so
``except capreward.CaprewardError`` catches whatever capreward raises on purpose while
``except ValueError`` in existing code keeps working.

Example:
    >>> from capreward.errors import CaprewardError
    >>> from capreward.media import MediaError
    >>> issubclass(MediaError, CaprewardError) and issubclass(MediaError, ValueError)
    True
"""

from __future__ import annotations


class CaprewardError(Exception):
    """The root of every exception capreward raises on purpose (each message names what to fix).

    Subclasses keep their builtin base too (``class MediaError(CaprewardError, ValueError)``)."""


__all__ = ["CaprewardError"]
