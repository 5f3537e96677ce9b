"""Node-level events: when the devices of this node change (PCI hot-plug)."""
