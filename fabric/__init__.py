"""The simulated PCIe/CXL fabric and simulated hosts.

These are features, not test hacks: the demo, the e2e tests and the kind
scripts run patchbay against them. Imports from ``driver`` are limited to its
types; nothing here imports ``plugin``.
"""
