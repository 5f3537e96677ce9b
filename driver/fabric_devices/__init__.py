"""Fabric-attached devices as both sides see them: the names of fabric pool
variants (shared by the controller and the node plugin, so neither needs to
ask the other), and the node plugin's view of GPUs behind fabric adapters."""
