"""Node-level discovery: what devices this node has now, and when that changes."""
