"""GPU sharing strategies of one claim (``GpuConfig.sharing``): time-slicing
through ``nvidia-smi``, MPS through a control daemon of the claim's own.

``claims.GpuSharing`` is the preparer's :class:`driver.devices.handler.ClaimSharing`;
``timeslice`` and ``mps`` are the two side effects it drives.
"""
