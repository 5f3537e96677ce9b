"""The cluster controller (``patchbay-controller``): publishes the fabric
pool and turns fabric allocations into attachments (ARCHITECTURE.md s. 7)."""
