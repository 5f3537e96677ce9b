"""The controller's half of GPU health: fabric devices a node found failed
(docs/health.md, "The fabric path")."""
