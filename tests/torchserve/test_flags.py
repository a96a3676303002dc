"""TorchServe's own flags on ``weir up``: taken when needless, refused when unsupported."""

from __future__ import annotations

import logging

import pytest

from weir import cli
from weir.errors import ConfigError
from weir.torchserve import flags


def parsed(*argv: str) -> dict[str, object]:
    return cli._overrides(cli._parser().parse_args(["up", *argv]))


def test_needless_flags_are_taken_and_named_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    options = parsed(
        "--ncs", "--disable-token-auth", "--foreground", "--log-config", "log4j2.xml",
        "--models", "all", "--enable-model-api",
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="weir.torchserve.flags"):
        flags.take(options)
    assert options == {"models": ["all"]}  # what is left goes to UpSettings
    logged = caplog.text
    assert "torchserve's --ncs is not needed: Weir writes no config snapshots" in logged
    assert "--log-config=log4j2.xml is not needed" in logged
    for flag in ("--disable-token-auth", "--foreground", "--enable-model-api"):
        assert f"torchserve's {flag} is not needed" in logged


def test_a_flag_asking_for_what_weir_does_not_do_stops_weir_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(ConfigError, match="--workflow-store: TorchServe's workflows are not"):
        flags.take(parsed("--workflow-store", "wf-store"))
    assert cli.main(["up", "--ncs", "--workflow-store", "wf-store"]) == 2
    assert "weir up: --workflow-store: TorchServe's workflows" in capsys.readouterr().err
