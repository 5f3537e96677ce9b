"""CXL Type 3 memory in devdax mode, handed to containers as ``/dev/daxR.0``."""

KIND = "cxlmem"  # the device type (attribute ``patchbay.dev/type``) and fabric kind
