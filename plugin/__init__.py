"""The node-side kubelet plugin process: gRPC servers on Unix sockets, the
registration handshake, and the glue that turns kubelet calls into driver
operations. The only package allowed to touch gRPC and generated protobuf code.
"""
