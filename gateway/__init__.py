"""The gateway: KServe v2 / Triton HTTP in front of the mesh. Stateless; no torch."""
