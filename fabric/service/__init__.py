"""The simulated PCIe/CXL fabric service (process ``patchbay-fabric``).

A Redfish-shaped REST API over a topology file, with durable state in
SQLite and host-side effects on simulated hosts. See ``main.py`` for the
process and its concurrency model, ``redfish.py`` for the resource shapes.
"""
