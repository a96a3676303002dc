"""The python backend runs a TorchServe-shaped handler from ``<version>/model.py`` per batch."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from weir.config import ModelConfig
from weir.errors import ConfigError, ErrorKind, InvalidInput, ServerError
from weir.tensors import Tensor
from weir.wire import InferRequest
from workers.backends import load_backend
from workers.backends.python_backend import PythonBackend
from workers.execution import BatchRunner

SHOUTER = '''
import numpy as np

class Shouter:
    """Upper-cases TEXT and counts its characters; records what each stage saw."""

    def initialize(self, context):
        self.context = context
        self.batches = []
        self.suffix = context.parameters.get("suffix", "").encode()

    def preprocess(self, batch):
        self.batches.append(batch["TEXT"].shape)
        return [text.upper() + self.suffix for text in batch["TEXT"].reshape(-1)]

    def inference(self, texts):
        if any(text.startswith(b"BOOM") for text in texts):
            raise RuntimeError("the model blew up")
        return texts

    def postprocess(self, texts):
        return {
            "SHOUTED": np.array(texts, dtype=object).reshape(-1, 1),
            "LENGTH": [[len(text)] for text in texts],
        }
'''


def config(**overrides: Any) -> ModelConfig:
    raw: dict[str, Any] = {
        "name": "shouter",
        "backend": "python",
        "max_batch_size": 8,
        "input": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]}],
        "output": [
            {"name": "SHOUTED", "data_type": "TYPE_STRING", "dims": [1]},
            {"name": "LENGTH", "data_type": "TYPE_INT32", "dims": [1]},
        ],
        "parameters": {"suffix": "!"},
    }
    raw.update(overrides)
    return ModelConfig.model_validate(raw)


def write_model(tmp_path: Path, source: str, version: str = "1") -> Path:
    version_dir = tmp_path / "shouter" / version
    version_dir.mkdir(parents=True)
    (version_dir / "model.py").write_text(textwrap.dedent(source))
    return version_dir


def request(texts: list[bytes]) -> InferRequest:
    array = np.array([[t] for t in texts], dtype=object)
    tensor = Tensor.from_numpy(array)
    return InferRequest(f"r-{texts[0]!r}", "shouter", "1", {"TEXT": tensor}, "reply", 0)


def decoded(tensor: Tensor) -> list[Any]:
    return tensor.to_numpy().reshape(-1).tolist()


def test_handler_runs_one_batch_over_three_requests_with_bytes_in_and_out(
    tmp_path: Path,
) -> None:
    backend = load_backend(config(), write_model(tmp_path, SHOUTER))
    runner = BatchRunner(config(), backend)
    requests = [request([b"hi"]), request([b"a", b"bc"]), request(["héllo".encode()])]

    replies, executions = runner.run(requests)

    assert executions == [4]
    assert isinstance(backend, PythonBackend)
    assert backend.handler.batches == [(4, 1)]
    assert [decoded(r.outputs["SHOUTED"]) for r in replies] == [
        [b"HI!"],
        [b"A!", b"BC!"],
        ["HéLLO!".encode()],
    ]
    assert [r.outputs["SHOUTED"].datatype for r in replies] == ["BYTES"] * 3
    assert [decoded(r.outputs["LENGTH"]) for r in replies] == [[3], [2, 3], [7]]
    assert replies[1].outputs["LENGTH"].datatype == "INT32"


def test_initialize_gets_name_version_directory_config_and_parameters(tmp_path: Path) -> None:
    version_dir = write_model(tmp_path, SHOUTER, version="3")
    backend = load_backend(config(), version_dir)

    context = backend.handler.context
    assert context.model_name == "shouter"
    assert context.model_version == "3"
    assert context.model_dir == version_dir
    assert context.config == config()
    assert context.parameters == {"suffix": "!"}
    assert context.system_properties["model_dir"] == str(version_dir)


@pytest.mark.parametrize(
    ("device", "kind", "device_id"), [(None, "CPU", "0"), (0, "GPU", "0"), (1, "GPU", "1")]
)
def test_initialize_gets_the_instance_kind_and_device_by_tritons_names(
    tmp_path: Path, device: int | None, kind: str, device_id: str
) -> None:
    version_dir = write_model(tmp_path, SHOUTER)
    context = PythonBackend(config(), version_dir, device).handler.context

    assert context.model_instance_kind == kind
    assert context.model_instance_device_id == device_id
    assert context.system_properties == {"model_dir": str(version_dir), "gpu_id": device}
    assert (context.model_name, context.parameters) == ("shouter", {"suffix": "!"})


def test_handler_exception_fails_only_the_request_it_failed_on(tmp_path: Path) -> None:
    runner = BatchRunner(config(), load_backend(config(), write_model(tmp_path, SHOUTER)))
    requests = [request([b"fine"]), request([b"boom"]), request([b"also fine"])]

    replies, _ = runner.run(requests)

    assert [r.id for r in replies] == [r.id for r in requests]
    fine, boom, also_fine = replies
    assert decoded(fine.outputs["SHOUTED"]) == [b"FINE!"]
    assert decoded(also_fine.outputs["SHOUTED"]) == [b"ALSO FINE!"]
    assert boom.error is not None and boom.outputs == {}
    kind, message = boom.error
    assert kind == ErrorKind.INTERNAL
    assert "model 'shouter' failed in inference" in message
    assert "RuntimeError: the model blew up" in message


def test_handler_exception_fails_the_batch_without_isolation(tmp_path: Path) -> None:
    backend = load_backend(config(), write_model(tmp_path, SHOUTER))
    runner = BatchRunner(config(), backend, isolation_runs=0)
    replies, _ = runner.run([request([b"fine"]), request([b"boom"])])
    assert all(r.error is not None for r in replies)


def test_weir_error_from_a_handler_keeps_its_kind(tmp_path: Path) -> None:
    source = """
    from weir.errors import InvalidInput

    class Picky:
        def initialize(self, context):
            pass

        def inference(self, batch):
            raise InvalidInput("TEXT must not be empty")
    """
    backend = load_backend(config(), write_model(tmp_path, source))

    with pytest.raises(InvalidInput, match="TEXT must not be empty"):
        backend.infer({"TEXT": np.array([[b""]], dtype=object)})


def test_preprocess_and_postprocess_are_optional(tmp_path: Path) -> None:
    source = """
    class Echo:
        def initialize(self, context):
            pass

        def inference(self, batch):
            return {"SHOUTED": batch["TEXT"], "LENGTH": [[1]] * len(batch["TEXT"])}
    """
    backend = load_backend(config(), write_model(tmp_path, source))

    outputs = backend.infer({"TEXT": np.array([[b"x"], [b"y"]], dtype=object)})

    assert outputs["SHOUTED"].tolist() == [[b"x"], [b"y"]]
    assert outputs["LENGTH"].dtype == np.int32


def test_float64_output_is_cast_to_the_config_datatype(tmp_path: Path) -> None:
    source = """
    import numpy as np

    class Halver:
        def initialize(self, context):
            pass

        def inference(self, batch):
            return {"HALF": batch["X"] / 2.0}
    """
    cfg = config(
        input=[{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
        output=[{"name": "HALF", "data_type": "TYPE_FP32", "dims": [2]}],
    )
    backend = load_backend(cfg, write_model(tmp_path, source))

    out = backend.infer({"X": np.array([[1, 3]], dtype=np.float64)})["HALF"]

    assert out.dtype == np.float32
    assert out.tolist() == [[0.5, 1.5]]


def test_float_output_for_an_integer_config_is_a_server_error(tmp_path: Path) -> None:
    source = """
    class Wrong:
        def initialize(self, context):
            pass

        def inference(self, batch):
            return {"SHOUTED": batch["TEXT"], "LENGTH": [[0.5]]}
    """
    backend = load_backend(config(), write_model(tmp_path, source))

    with pytest.raises(ServerError, match="returned LENGTH as float64, config says INT32"):
        backend.infer({"TEXT": np.array([[b"x"]], dtype=object)})


def test_missing_output_is_a_server_error(tmp_path: Path) -> None:
    source = """
    class Forgetful:
        def initialize(self, context):
            pass

        def inference(self, batch):
            return {"SHOUTED": batch["TEXT"]}
    """
    backend = load_backend(config(), write_model(tmp_path, source))

    with pytest.raises(ServerError, match="returned no output LENGTH"):
        backend.infer({"TEXT": np.array([[b"x"]], dtype=object)})


def test_handler_attribute_picks_the_class_among_several(tmp_path: Path) -> None:
    source = """
    class First:
        def initialize(self, context):
            self.name = "first"

        def inference(self, batch):
            return batch

    class Second(First):
        def initialize(self, context):
            self.name = "second"

    handler = Second
    """
    backend = load_backend(config(), write_model(tmp_path, source))

    assert backend.handler.name == "second"


def test_two_candidate_classes_without_handler_attribute_is_a_config_error(
    tmp_path: Path,
) -> None:
    source = """
    class First:
        def initialize(self, context): ...
        def inference(self, batch): ...

    class Second(First): ...
    """
    version_dir = write_model(tmp_path, source)

    with pytest.raises(ConfigError, match="found First, Second") as info:
        load_backend(config(), version_dir)
    assert str(version_dir / "model.py") in str(info.value)


def test_imported_classes_are_not_candidates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "shared_handlers.py").write_text(
        "class Base:\n    def initialize(self, context): ...\n    def inference(self, batch): ...\n"
    )
    monkeypatch.syspath_prepend(str(helpers))
    source = """
    from shared_handlers import Base
    from workers.backends.python_backend import HandlerContext

    class Only(Base):
        def initialize(self, context):
            self.ok = isinstance(context, HandlerContext)
    """
    backend = load_backend(config(), write_model(tmp_path, source))

    assert type(backend.handler).__name__ == "Only"
    assert backend.handler.ok is True


def test_module_without_handler_class_is_a_config_error(tmp_path: Path) -> None:
    version_dir = write_model(tmp_path, "def inference(batch):\n    return batch\n")

    with pytest.raises(ConfigError, match=r"expected one class .* \(found none\)"):
        load_backend(config(), version_dir)


def test_missing_model_py_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()

    with pytest.raises(ConfigError, match=r"no model\.py"):
        load_backend(config(), tmp_path / "1")


def test_import_error_in_model_py_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    version_dir = write_model(tmp_path, "import no_such_module_anywhere\n")

    with pytest.raises(ConfigError, match="import failed: ModuleNotFoundError") as info:
        load_backend(config(), version_dir)
    assert str(version_dir / "model.py") in str(info.value)


def test_initialize_failure_is_a_config_error(tmp_path: Path) -> None:
    source = """
    class Broken:
        def initialize(self, context):
            raise FileNotFoundError("vocab.txt")

        def inference(self, batch):
            return batch
    """
    with pytest.raises(ConfigError, match=r"Broken\.initialize failed: FileNotFoundError"):
        load_backend(config(), write_model(tmp_path, source))


def test_each_instance_gets_its_own_module_and_handler(tmp_path: Path) -> None:
    source = """
    LOADS = []

    class Counter:
        def initialize(self, context):
            LOADS.append(1)
            self.loads = len(LOADS)

        def inference(self, batch):
            return batch
    """
    version_dir = write_model(tmp_path, source)
    first, second = (load_backend(config(), version_dir) for _ in range(2))

    assert first.handler.loads == second.handler.loads == 1
    assert first.handler is not second.handler


def test_default_model_filename_names_the_handler_file(tmp_path: Path) -> None:
    version_dir = write_model(tmp_path, SHOUTER)
    (version_dir / "model.py").rename(version_dir / "shouter_handler.py")
    named = config(default_model_filename="shouter_handler.py")
    backend = load_backend(named, version_dir)
    replies, _ = BatchRunner(named, backend).run([request([b"hey"])])
    assert decoded(replies[0].outputs["SHOUTED"]) == [b"HEY!"]
