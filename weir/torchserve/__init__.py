"""TorchServe compatibility: archives, ``config.properties``, the model store, the envelope.

Model archives (``.mar``) are read by :mod:`~weir.torchserve.archive`; TorchServe's
``config.properties`` by :mod:`~weir.torchserve.properties`; a TorchServe request crosses
the mesh as :mod:`~weir.torchserve.envelope` describes; :mod:`~weir.torchserve.store` turns
a model store's archives into entries of a Triton-layout repository.
"""
