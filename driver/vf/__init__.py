"""SR-IOV virtual functions: discovery from sysfs, preparation, configs."""
