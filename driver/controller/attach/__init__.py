"""Attach and detach: one operation per fabric device, and what each writes."""
