"""The integration tier shares the cluster fixtures of the e2e tier (one
control plane per run); claims need a real apiserver."""

from tests.e2e.conftest import api_client, core, local_cluster, namespace, resource_api

__all__ = ["api_client", "core", "local_cluster", "namespace", "resource_api"]
