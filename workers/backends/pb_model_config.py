"""``pb_utils.ModelConfig``: what a Triton Python model's ``auto_complete_config`` receives.

``TritonPythonModel.auto_complete_config(config)`` is a static method that fills what the
model's ``config.pbtxt`` left out, before the model loads: its inputs and outputs, its
``max_batch_size``, dynamic batching, decoupled. It may change only those, by the methods
below, with Triton's rules: a value the config file already gives may be repeated but not
contradicted (a datatype or dims of a tensor it names, a ``max_batch_size`` it sets higher,
a ``decoupled`` it states), so a model never overrides its operator's file.
:mod:`workers.backends.triton_autocomplete` calls it, in a process of its own.
"""

from __future__ import annotations

import json
from typing import Any

INPUT_FIELDS = ("name", "data_type", "dims", "optional")
OUTPUT_FIELDS = ("name", "data_type", "dims")
REQUIRED_FIELDS = ("name", "data_type", "dims")
UNSET_TYPE = "TYPE_INVALID"


class ModelConfig:
    """The model's config as Triton's JSON, changed by ``auto_complete_config``."""

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        given = json.loads(model_config) if isinstance(model_config, str) else model_config
        self._config: dict[str, Any] = dict(given)
        self._config.setdefault("max_batch_size", 0)
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])

    @property
    def _name(self) -> str:
        return str(self._config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        """The config as it stands (Triton's JSON field names)."""
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """The most rows a batch holds; never lower than the config file's own value."""
        given = int(self._config.get("max_batch_size") or 0)
        if given > max_batch_size:
            raise ValueError(
                f"model '{self._name}': the configuration sets max_batch_size {given}, "
                f"auto_complete_config asks for {max_batch_size}, which is smaller"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Dynamic batching as the scheduler, unless another scheduler is configured."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._config:
                raise ValueError(
                    f"model '{self._name}': the configuration schedules with {other}; "
                    "auto_complete_config cannot set dynamic_batching"
                )
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        """A model input; one the config names must agree with it."""
        self._add("input", input, INPUT_FIELDS)

    def add_output(self, output: dict[str, Any]) -> None:
        """A model output; one the config names must agree with it."""
        self._add("output", output, OUTPUT_FIELDS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """``{"decoupled": bool}``; a config that states ``decoupled`` must agree."""
        unknown = [key for key in transaction_policy_dict if key != "decoupled"]
        if unknown:
            raise ValueError(
                f"model '{self._name}': model_transaction_policy in auto_complete_config "
                f"takes only 'decoupled', not {unknown[0]!r}"
            )
        policy = self._config.setdefault("model_transaction_policy", {})
        if "decoupled" not in transaction_policy_dict:
            return
        wanted = bool(transaction_policy_dict["decoupled"])
        if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
            raise ValueError(
                f"model '{self._name}': the configuration sets decoupled "
                f"{bool(policy['decoupled'])}; auto_complete_config cannot change it"
            )
        policy["decoupled"] = wanted

    def _add(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        _check_fields(self._name, kind, tensor, allowed)
        for present in self._config[kind]:
            if present.get("name") == tensor["name"]:
                _agree(self._name, kind, present, tensor)
                present.update({k: tensor[k] for k in allowed if k in tensor and k != "name"})
                return
        self._config[kind].append(dict(tensor))


def _check_fields(model: str, kind: str, tensor: Any, allowed: tuple[str, ...]) -> None:
    if not isinstance(tensor, dict):
        raise ValueError(f"model '{model}': an {kind} in auto_complete_config must be a dict")
    label = f"{kind} {tensor.get('name', '')!r}" if "name" in tensor else f"an {kind}"
    extra = [key for key in tensor if key not in allowed]
    if extra:
        raise ValueError(
            f"model '{model}': {label} in auto_complete_config has {extra[0]!r}; "
            f"an {kind} takes only {', '.join(allowed)}"
        )
    missing = [key for key in REQUIRED_FIELDS if key not in tensor]
    if missing:
        raise ValueError(f"model '{model}': {label} in auto_complete_config lacks {missing[0]!r}")


def _agree(model: str, kind: str, present: dict[str, Any], tensor: dict[str, Any]) -> None:
    name = tensor["name"]
    given_type = present.get("data_type", UNSET_TYPE)
    if given_type != UNSET_TYPE and given_type != tensor["data_type"]:
        raise ValueError(
            f"model '{model}': {kind} '{name}': the configuration says {given_type}, "
            f"auto_complete_config says {tensor['data_type']}"
        )
    given_dims = [int(d) for d in present.get("dims") or []]
    if given_dims and given_dims != [int(d) for d in tensor["dims"]]:
        raise ValueError(
            f"model '{model}': {kind} '{name}': the configuration gives dims {given_dims}, "
            f"auto_complete_config gives {list(tensor['dims'])}"
        )
    if "optional" in present and "optional" in tensor and present["optional"] != tensor["optional"]:
        raise ValueError(
            f"model '{model}': {kind} '{name}': the configuration says optional "
            f"{present['optional']}, auto_complete_config says {tensor['optional']}"
        )
