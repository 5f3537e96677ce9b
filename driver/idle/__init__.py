"""Idle devices (issue 37): how busy each prepared device is, and when it is idle."""
