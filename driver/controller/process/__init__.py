"""The controller process: entry point, settings, leader Lease, admission webhook."""
