"""A chat backend built on its first request (shared by `capreward score` and the GRPO recipe)."""

from __future__ import annotations


class LazyBackend:
    """A chat backend built on its first request (the local judge is loaded only when questions must be
    written)."""

    def __init__(self, build):
        self._build, self._backend = build, None

    @property
    def name(self) -> str:
        return self._get().name

    def _get(self):
        if self._backend is None:
            self._backend = self._build()
        return self._backend

    def generate(self, requests):
        return self._get().generate(requests)

    async def agenerate(self, requests):
        return await self._get().agenerate(requests)
