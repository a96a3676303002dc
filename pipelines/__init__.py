"""Pipelines: ensemble DAGs of model steps, and the plan that routes a request through them.

See :mod:`pipelines.graph` for the planning API the gateway and the workers build on.
"""

from __future__ import annotations

from pipelines.graph import Pipeline, Step, load_pipelines

__all__ = ["Pipeline", "Step", "load_pipelines"]
