"""Generated protobuf/gRPC stubs for the kubelet APIs; regenerate with
``make proto`` (hack/protogen.py), never edit by hand."""
