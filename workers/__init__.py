"""Worker pools: load the models a pool serves, run batches, reply or forward."""
