"""The e2e tests' DynamicClient, with its discovery cache kept out of /tmp.

Why this module exists: ``kubernetes.dynamic`` caches the API discovery in
``/tmp/osrcp-<md5 of the apiserver's address>.json`` and never removes it,
so every control plane a run started (a fresh port each) left a file behind
(three after one clean-clone run). Here the cache lives in the session's run
directory (``tests.cluster_fixtures.RUN_DIR``), which the session removes
(or keeps, with the logs, when a test failed).
"""

from __future__ import annotations

import hashlib

from kubernetes import client
from kubernetes.dynamic import DynamicClient

from tests.cluster_fixtures import RUN_DIR


def dynamic_client(api: client.ApiClient) -> DynamicClient:
    """A DynamicClient on ``api`` whose discovery cache is a file of the run
    directory, one per apiserver (a session may run a second cluster)."""
    host = hashlib.sha256(api.configuration.host.encode()).hexdigest()[:16]
    return DynamicClient(api, cache_file=str(RUN_DIR / f"discovery-{host}.json"))
