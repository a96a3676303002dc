"""A Triton Python model completes its own config (``auto_complete_config``), as in Triton.

Each test reads a real repository: the model file runs in its own process, as it does in
every service that reads the repository.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from weir.completion import Completion
from weir.config import Backend
from weir.errors import ConfigError
from weir.repository import Repository

HOOK = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(auto_complete_model_config):
            print("printed by the model, not part of the answer")
            {body}
            return auto_complete_model_config

        def execute(self, requests):
            return []
"""
FILL = """
            config = auto_complete_model_config
            present = {t["name"] for t in config.as_dict()["input"]}
            if "INPUT0" not in present:
                config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
            config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
            config.set_max_batch_size(8)
            config.set_dynamic_batching()
"""


def model(root: Path, body: str, config: str | None = 'backend: "python"\n') -> Path:
    version = root / "filled" / "1"
    version.mkdir(parents=True)
    hook = textwrap.dedent(HOOK).replace(
        "{body}", textwrap.dedent(body).strip().replace("\n", "\n        ")
    )
    (version / "model.py").write_text(hook)
    if config is not None:
        (root / "filled" / "config.pbtxt").write_text(config)
    return version / "model.py"


def test_a_config_of_one_line_is_filled_by_the_model(tmp_path: Path) -> None:
    model(tmp_path, FILL)
    config = Repository.load(tmp_path).models["filled"].config
    assert [(t.name, t.datatype, t.dims) for t in config.input] == [("INPUT0", "FP32", (4,))]
    assert [(t.name, t.datatype, t.dims) for t in config.output] == [("OUTPUT0", "FP32", (4,))]
    assert config.max_batch_size == 8
    assert config.dynamic_batching is not None


def test_a_model_with_no_config_file_at_all_is_python(tmp_path: Path) -> None:
    model(tmp_path, FILL, config=None)
    config = Repository.load(tmp_path).models["filled"].config
    assert config.backend is Backend.PYTHON
    assert config.max_batch_size == 8


def test_what_the_config_file_says_is_kept(tmp_path: Path) -> None:
    given = """
        backend: "python"
        max_batch_size: 16
        input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]
        instance_group [{ count: 2, kind: KIND_CPU }]
    """
    model(tmp_path, FILL.replace("set_max_batch_size(8)", "set_max_batch_size(16)"), given)
    config = Repository.load(tmp_path).models["filled"].config
    assert config.max_batch_size == 16
    assert config.instance_group[0].count == 2
    assert [t.name for t in config.input] == ["INPUT0"]


def test_decoupled_is_set_by_the_model(tmp_path: Path) -> None:
    decoupled = 'config.set_model_transaction_policy({"decoupled": True})'
    model(tmp_path, FILL + " " * 12 + decoupled)
    assert Repository.load(tmp_path).models["filled"].config.decoupled


def test_a_model_contradicting_its_config_file_does_not_load(tmp_path: Path) -> None:
    given = 'backend: "python"\ninput [{ name: "INPUT0", data_type: TYPE_INT32, dims: [4] }]\n'
    path = model(tmp_path, FILL.replace('if "INPUT0" not in present:', "if True:"), given)
    with pytest.raises(ConfigError) as caught:
        Repository.load(tmp_path)
    message = str(caught.value)
    assert str(path) in message and "auto_complete_config failed" in message
    assert "ValueError" in message and "says TYPE_INT32" in message


def test_a_model_that_cannot_be_imported_names_the_reason(tmp_path: Path) -> None:
    path = model(tmp_path, FILL)
    path.write_text("import weir_no_such_module\n" + path.read_text())
    with pytest.raises(ConfigError, match="No module named 'weir_no_such_module'"):
        Repository.load(tmp_path)


def test_a_hook_that_returns_something_else_is_refused(tmp_path: Path) -> None:
    path = model(tmp_path, FILL)
    path.write_text(path.read_text().replace("return auto_complete_model_config", "return {}"))
    with pytest.raises(ConfigError, match="returned dict; it must return the pb_utils"):
        Repository.load(tmp_path)


def test_a_hook_that_never_returns_meets_the_time_limit(tmp_path: Path) -> None:
    model(tmp_path, "import threading\nthreading.Event().wait()")
    with pytest.raises(ConfigError, match=r"did not return within 1 s \(WEIR_AUTOCOMPLETE"):
        Repository.load(tmp_path, Completion(python_timeout_s=1))
