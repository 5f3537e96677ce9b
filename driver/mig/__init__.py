"""Dynamic MIG: every (profile, placement) published as a partitionable device."""
