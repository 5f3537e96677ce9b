"""patchbay's domain core: the typed device model, discovery backends, slice
building, checkpoint and CDI logic, and the cluster controller.

Nothing in this package speaks gRPC or imports the plugin or the fabric; the
layering is enforced by import-linter (see pyproject.toml).
"""

DRIVER_NAME = "patchbay.dev"
