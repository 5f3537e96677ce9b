"""NVML access: the backend interface (``backend``), the real implementation
over ``pynvml`` (``pynvml_backend``, the only module that imports pynvml) and
an in-memory fake with the same semantics (``fake``)."""
