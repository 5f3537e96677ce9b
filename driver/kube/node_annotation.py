"""One annotation of the plugin's own Node, kept equal to the latest text.

Why: the plugin tells the cluster two things through annotations of its
Node, the only fields of the Node it may change (the chart's
``<release>-plugin-node-fields`` policy names them): the fabric report
(``patchbay.dev/fabric``, read by the controller) and the GPUs' health
history (``patchbay.dev/health``, read by ``kubectl patchbay nodes``). Both
are written the same way: a JSON merge patch of that one key whenever the
wanted text differs from the last one written (never on a timer), retried
with jittered backoff (after an outage every node writes: not at once).
``None`` removes the annotation. :meth:`NodeAnnotation.seed` takes what the
Node already holds, so a restarted plugin that wants the same text writes
nothing.

Concurrency: :meth:`set` and :meth:`seed` on the loop; :meth:`run` is one
asyncio task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from driver.backoff import Backoff
from driver.errors import ApiError
from driver.kube.client import KubeClient

log = logging.getLogger(__name__)


class NodeAnnotation:
    """Keeps the annotation ``key`` of Node ``node_name`` equal to the latest text."""

    def __init__(self, api: KubeClient, node_name: str, key: str, what: str) -> None:
        self._api = api
        self._path = f"/api/v1/nodes/{node_name}"
        self.key = key
        self._what = what  # for the log: "node fabric report"
        self._want: str | None = None
        self._written: str | None = None  # None: absent (or not known to be there)
        self._wanted = False  # nothing is written (or removed) before the first set
        self._dirty = asyncio.Event()

    @property
    def written(self) -> str | None:
        return self._written

    @property
    def pending(self) -> bool:
        """Whether a write (or removal) is due."""
        return self._wanted and self._want != self._written

    def seed(self, node: Mapping[str, Any]) -> None:
        """What the Node holds now (read at start): no write if that is wanted."""
        self._written = ((node.get("metadata") or {}).get("annotations") or {}).get(self.key)
        self._kick()

    def set(self, text: str | None) -> None:
        self._want, self._wanted = text, True
        self._kick()

    def _kick(self) -> None:
        if self.pending:
            self._dirty.set()

    async def sync(self) -> None:
        """Write what is pending, once (raises :class:`ApiError`)."""
        if not self.pending:
            return
        want = self._want
        await self._api.merge_patch(self._path, {"metadata": {"annotations": {self.key: want}}})
        self._written = want
        log.info("%s written: %s", self._what, want)

    async def run(self) -> None:
        backoff = Backoff(jitter=0.5)
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self.sync()
                backoff.reset()
            except ApiError as exc:
                delay = backoff.next()
                log.warning("writing the %s failed (retry in %.1fs): %s", self._what, delay, exc)
                await asyncio.sleep(delay)
                self._dirty.set()
