"""Hugging Face hub access for model loading: the local cache first, the network only when it answers.

huggingface_hub retries an unreachable hub for about a minute per file before it gives up, so a
missing model used to cost minutes of silence. :func:`load_cached_first` instead loads from the cache
with downloads forbidden, and only when that fails and downloads are possible (``HF_HUB_OFFLINE`` unset
and the hub answering one bounded probe, :func:`hub_reachable`) loads again with downloads allowed.

The hub is blamed only when it was asked: a model named by a folder on this machine (``source``, see
:func:`load_cached_first`) is loaded from that folder alone, and a folder that is not a model says so
(:class:`NotAModel`, with what is wrong with it), as does a path that does not exist. A folder whose
``config.json`` asks for its own code (``auto_map``: transformers' ``trust_remote_code``) is refused
before anything of it is imported: capreward loads the model classes transformers ships, never code
a model folder brings (the loaders also pass ``trust_remote_code=False``, so transformers never asks
on a terminal).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import urllib.error
import urllib.request
from typing import TypeVar
from collections.abc import Callable, Iterator

from .errors import CaprewardError

T = TypeVar("T")

#: Seconds the reachability probe may take in all (name resolution included).
PROBE_TIMEOUT = 3.0

_offline_lock = threading.RLock()
_probe_results: dict[str, bool] = {}


class ModelNotAvailable(CaprewardError, OSError):
    """A model is neither in the local cache nor downloadable now; ``reason`` says why in a few words."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def offline_by_env() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` forbids downloads (as huggingface_hub reads them)."""
    from huggingface_hub import constants

    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return bool(constants.HF_HUB_OFFLINE) or any(f and f.strip().upper() in {"1", "ON", "YES", "TRUE"} for f in flags)


def hub_endpoint() -> str:
    """The hub's base URL (``HF_ENDPOINT`` or https://huggingface.co)."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _probe(url: str, timeout: float, answer: list[bool]) -> None:
    try:
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=timeout):
            answer.append(True)
    except urllib.error.HTTPError:
        answer.append(True)  # the hub answered, even if not with 200
    except Exception:
        answer.append(False)


def hub_reachable(timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the hub answers one HEAD request within ``timeout`` seconds in all (a hanging name lookup
    included: the probe runs in a daemon thread that is abandoned at the deadline). Proxies from the
    environment are honoured. The answer is remembered for the process."""
    url = hub_endpoint()
    if url not in _probe_results:
        answer: list[bool] = []
        thread = threading.Thread(target=_probe, args=(url, timeout, answer), daemon=True, name="hub-probe")
        thread.start()
        thread.join(timeout)
        _probe_results[url] = bool(answer and answer[0])
    return _probe_results[url]


def download_blocker() -> str | None:
    """None when a download may be tried; otherwise why not, in a few words."""
    if offline_by_env():
        return "HF_HUB_OFFLINE is set"
    if not hub_reachable():
        return f"the hub ({hub_endpoint()}) is unreachable"
    return None


class _DropRecordsFrom(logging.Filter):
    def __init__(self, package: str):
        super().__init__()
        self.marker = os.sep + package + os.sep

    def filter(self, record: logging.LogRecord) -> bool:
        return self.marker not in record.pathname


@contextlib.contextmanager
def quiet_root_logging(*packages: str) -> Iterator[None]:
    """Within the block, records that modules of ``packages`` log on the root logger are dropped (open_clip
    logs its failures there before raising them; the caller reports the failure once)."""
    root = logging.getLogger()
    filters = [_DropRecordsFrom(p) for p in packages]
    for f in filters:
        root.addFilter(f)
    try:
        yield
    finally:
        for f in filters:
            root.removeFilter(f)


@contextlib.contextmanager
def cache_only() -> Iterator[None]:
    """Within the block huggingface_hub (and so open_clip and transformers) reads the local cache only and
    fails at once on a missing file."""
    from huggingface_hub import constants

    with _offline_lock:
        before = constants.HF_HUB_OFFLINE
        constants.HF_HUB_OFFLINE = True
        try:
            yield
        finally:
            constants.HF_HUB_OFFLINE = before


class NotAModel(CaprewardError, OSError):
    """A model named by a path on this machine that is no model capreward can load (a folder of other
    files, a folder that asks to run its own code, a path that does not exist); the message says which,
    and never blames the hub, which was not asked."""


#: How a model's source given as a path looks (a hub name is ``org/name``, never starting so).
_PATH_PREFIXES = ("/", "./", "../", "~", ".\\", "..\\")


def local_source(source: str | os.PathLike | None) -> str | None:
    """The path ``source`` names on this machine (``local-dir:`` stripped), when it is one: an existing
    file or folder, or a name that can only be a path (absolute, ``./``, ``../``, ``~``); None for a hub
    name or tag."""
    if source is None:
        return None
    text = os.fspath(source)
    text = text[len("local-dir:"):] if text.startswith("local-dir:") else text
    if os.path.exists(os.path.expanduser(text)) or text.startswith(_PATH_PREFIXES):
        return text
    return None


def remote_code_problem(folder: str | os.PathLike) -> str | None:
    """Why ``folder``'s ``config.json`` (if any) cannot be loaded without running code it brings: its
    ``auto_map``; None when it asks for none."""
    path = os.path.join(os.path.expanduser(os.fspath(folder)), "config.json")
    try:
        from .input_files import read_regular_bytes

        config = json.loads(read_regular_bytes(path, "config.json")[: 1 << 22].decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
    if isinstance(config, dict) and config.get("auto_map"):
        names = ", ".join(sorted(map(str, config["auto_map"]))[:4]) if isinstance(config["auto_map"], dict) else ""
        return (f"its config.json asks to run the folder's own code (auto_map{': ' + names if names else ''}); "
                "capreward loads only the model classes transformers ships and never runs a model folder's code")
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def load_cached_first(load: Callable[[bool], T], what: str, failures: tuple[type[BaseException], ...] = (Exception,),
                      source: str | os.PathLike | None = None) -> T:
    """``load(local_only=True)``; if that raises one of ``failures`` and a download is possible,
    ``load(local_only=False)``. ``load`` must honour its argument (e.g. ``local_files_only`` or
    :func:`cache_only`). Raises :class:`ModelNotAvailable` naming ``what`` when the model is not cached and
    cannot be downloaded now; any other failure propagates.

    ``source``: the model's name as given. When it names a path on this machine (:func:`local_source`)
    the hub is never asked: a missing path, a folder that asks to run its own code
    (:func:`remote_code_problem`) or a folder ``load(local_only=True)`` fails on raises
    :class:`NotAModel` saying so."""
    local = local_source(source)
    if local is not None:
        folder = os.path.expanduser(local)
        if not os.path.exists(folder):
            raise NotAModel(f"{what}: {local} does not exist on this machine")
        if os.path.isdir(folder) and (problem := remote_code_problem(folder)) is not None:
            raise NotAModel(f"{what}: the folder {local} is refused: {problem}")
        try:
            return load(True)
        except failures as exc:
            kind = "folder" if os.path.isdir(folder) else "file"
            raise NotAModel(f"{what}: the {kind} {local} is not a model capreward can load ({_first_line(exc)})") from exc
    try:
        return load(True)
    except failures as exc:
        blocker = download_blocker()
        if blocker is None:
            return load(False)
        raise ModelNotAvailable(f"{what} is not in the local cache and cannot be downloaded ({blocker})",
                                reason=blocker) from exc
