"""The gRPC servicers the kubelet calls: plugin registration, the DRA service
(v1 and v1beta1) and device health. Each translates protobuf to the typed
models in ``driver`` and back; none holds driver logic."""
