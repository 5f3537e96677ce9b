"""PCI topology as sysfs shows it (real ``/sys`` or a simulated tree)."""
