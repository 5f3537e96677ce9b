"""NVML access: the backend interface (``backend``), the real implementation
over ``pynvml`` (``pynvml_backend`` with ``pynvml_library`` and ``pynvml_events``,
the only modules that import pynvml) and
an in-memory fake with the same semantics (``fake``)."""
