"""Fixtures shared by every tier. The cluster fixtures live in one plugin
module so the integration and e2e tiers share ONE control plane per run."""

pytest_plugins = ["tests.cluster_fixtures"]
