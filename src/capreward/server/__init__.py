"""The reward server: capreward's rewards over HTTP (``capreward serve``; OpenRLHF's ``/get_reward``).

- :mod:`capreward.server.http`: the HTTP server and its service (:func:`~capreward.server.http.make_server`).
- :mod:`capreward.server.batching`: dynamic batching across requests.
- :mod:`capreward.server.connections`: which connections the server admits (per peer, reserve).
- :mod:`capreward.server.ray_serve`: the server as Ray Serve replicas (``capreward[serve]``).
- :mod:`capreward.server.reward_func`: OpenRLHF's in-process ``reward_func`` file (the server's answer
  without HTTP).

The server reads :mod:`capreward.adapters` (the label format, path confinement, JSON limits, the batch
scorer); nothing there imports the server.

Names are imported on first use, so ``import capreward.server`` stays cheap.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports

_LAZY = {"DynamicBatcher": "capreward.server.batching", "RewardHTTPServer": "capreward.server.http",
         "RewardService": "capreward.server.http", "ServerLimits": "capreward.server.http",
         "make_server": "capreward.server.http"}

#: Documented in the API reference (docs/api/server.md); ``DynamicBatcher``, ``RewardHTTPServer`` and
#: ``RewardService`` still import from here.
__all__ = ["ServerLimits", "make_server"]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
