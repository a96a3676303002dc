"""TorchServe's REST APIs on the gateway.

Inference (``/ping``, ``/predictions``, ``/explanations``) on the HTTP port; management
(``/models``) on a port of its own.
"""
