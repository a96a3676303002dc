"""Every ``WEIR_*`` name the deploy files and their docs mention is a real setting.

compose.yaml, the Prometheus config, the Kubernetes base, the Dockerfiles and the READMEs
may name only variables some Weir settings class reads, or the few that configure the
deploy files themselves and never reach Weir.
"""

from __future__ import annotations

import re

from tests.deploy.deploy_files import (
    COMPOSE_FILE,
    DEPLOY_DOCS,
    DOCKER,
    K8S,
    PROMETHEUS_CONFIG,
    ROOT,
    setting_env_names,
)
from weir.settings import (
    BatcherSettings,
    GatewaySettings,
    ServiceSettings,
    WorkerSettings,
)
from weir.up_settings import UpSettings

# Variables of compose.yaml and the Dockerfiles that never reach Weir.
DEPLOY_ONLY_VARIABLES = {
    "WEIR_IMAGE",
    "WEIR_CUDA_IMAGE",
    "WEIR_EXAMPLES_IMAGE",
    "WEIR_BASE_IMAGE",
    "WEIR_CUDA_TORCH_INDEX_URL",
    "WEIR_REDIS_IMAGE",
    "WEIR_PROMETHEUS_IMAGE",
    "WEIR_MODELS_DIR",
    "WEIR_HTTP_PORTS",
    "WEIR_GRPC_PORTS",
    "WEIR_EXTRAS",
    "WEIR_REDIS_MAXMEMORY",
}


def test_every_weir_variable_the_deploy_files_and_docs_name_is_a_real_setting() -> None:
    settings = set().union(
        *(
            setting_env_names(cls)
            for cls in (ServiceSettings, GatewaySettings, BatcherSettings, WorkerSettings)
        ),
        setting_env_names(UpSettings),
    )
    texts = [
        COMPOSE_FILE,
        PROMETHEUS_CONFIG,
        *DEPLOY_DOCS,
        *K8S.glob("*.yaml"),
        *DOCKER.iterdir(),
    ]
    unknown = {
        f"{path.relative_to(ROOT)}: {variable}"
        for path in texts
        for variable in re.findall(r"\bWEIR_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())
        if variable not in settings | DEPLOY_ONLY_VARIABLES
    }
    assert not unknown, sorted(unknown)
