"""NVMe drives: found in sysfs, handed to containers as block and generic devices."""

KIND = "nvme"  # the device type (attribute ``patchbay.dev/type``) and fabric kind
