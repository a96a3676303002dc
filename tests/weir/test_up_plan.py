"""``weir up``'s plan: what the settings decide, carried unchanged to the lean supervisor."""

from __future__ import annotations

from pathlib import Path

from weir.cli import _overrides, _parser
from weir.up_plan import UpPlan
from weir.up_settings import UpSettings


def plan_of(*argv: str) -> UpPlan:
    return UpPlan.of(UpSettings(**_overrides(_parser().parse_args(["up", *argv]))))


def test_the_plan_survives_its_trip_through_the_environment(tmp_path: Path) -> None:
    plan = plan_of(
        "--http-port", "9100", "--cpu-workers", "3", "--batchers", "2", "--model-store",
        str(tmp_path),
    )  # fmt: skip
    assert UpPlan.decode(plan.encode()) == plan
    assert (plan.http_port, plan.cpu_workers, plan.batchers) == (9100, 3, 2)
    assert plan.model_store == str(tmp_path)
    assert plan_of().batchers == 1


def test_children_are_told_the_settings_only_weir_up_read(tmp_path: Path) -> None:
    plan = plan_of("--repository", str(tmp_path), "--grpc-port", "0", "--log-level", "DEBUG")
    env = plan.child_env
    assert env["WEIR_REPOSITORY"] == str(tmp_path.resolve())
    assert (env["WEIR_GATEWAY_GRPC_PORT"], env["WEIR_LOG_LEVEL"]) == ("0", "DEBUG")
    assert env["WEIR_MODEL_CONTROL_MODE"] == "none"
    assert not [name for name in env if name.startswith("WEIR_GATEWAY_TS_")]  # no model store
    store = plan_of("--model-store", str(tmp_path), "--ts-management-port", "9181").child_env
    assert store["WEIR_MODEL_STORE"] == str(tmp_path.resolve())
    assert store["WEIR_GATEWAY_TS_MANAGEMENT_PORT"] == "9181"
    assert store["WEIR_WORKER_TS_DECODE_INPUT_REQUEST"] == "True"
    assert store["WEIR_GATEWAY_TS_DEFAULT_STARTUP_TIMEOUT_S"] == "120"
    timed = UpPlan.of(UpSettings(model_store=tmp_path, ts_default_startup_timeout_s=600))
    assert timed.child_env["WEIR_GATEWAY_TS_DEFAULT_STARTUP_TIMEOUT_S"] == "600"
    raw = UpPlan.of(UpSettings(model_store=tmp_path, ts_decode_input_request=False))
    assert raw.child_env["WEIR_WORKER_TS_DECODE_INPUT_REQUEST"] == "False"
    assert all(isinstance(value, str) for value in {**env, **store}.values())
