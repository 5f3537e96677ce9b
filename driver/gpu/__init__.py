"""Full GPUs: discovery into devices and preparation into CDI edits."""
