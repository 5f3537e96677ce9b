"""Opaque device configuration carried in DeviceClasses and claims."""
