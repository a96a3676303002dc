"""The gateway: KServe v2 / Triton HTTP and gRPC in front of the mesh. Stateless; no torch."""
