"""The batcher: forms batches per (model, version) request stream by Triton's rules."""
