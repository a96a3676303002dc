"""What JSON a model's body may hold: the bound from its config, and the string-aware count.

The mesh tests (test_body_offload.py) show the refusals over HTTP; these pin the arithmetic
and the token count against a byte-at-a-time reference, across chunk boundaries.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import json_bounds, json_text
from gateway.json_bounds import JsonBudget
from weir.config import ModelConfig
from weir.errors import InvalidInput
from weir.settings import GatewaySettings


def model(inputs: list[dict[str, Any]], max_batch_size: int = 8, **params: str) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "name": "m",
            "backend": "python",
            "max_batch_size": max_batch_size,
            "input": inputs,
            "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
            "parameters": params,
        }
    )


def spec(data_type: str, dims: list[int], name: str = "X") -> dict[str, Any]:
    return {"name": name, "data_type": data_type, "dims": dims}


def test_fixed_inputs_bound_their_elements_and_the_lists_nesting_them() -> None:
    config = model([spec("TYPE_FP32", [64]), spec("TYPE_INT64", [2, 3], "Z")])
    # [8, 64]: 512 elements in 1 + 8 lists; [8, 2, 3]: 48 elements in 1 + 8 + 16 lists.
    assert json_bounds.budget(config, 100) == JsonBudget("m", 521 + 73, 100)


def test_an_unbatched_model_takes_its_dims_once() -> None:
    config = model([spec("TYPE_FP32", [4, 4])], max_batch_size=0)
    assert json_bounds.budget(config, 5) == JsonBudget("m", 16 + 5, 5)


def test_a_bytes_input_is_bounded_by_its_count_not_its_text() -> None:
    config = model([spec("TYPE_STRING", [1])])
    assert json_bounds.budget(config, 5) == JsonBudget("m", 8 + 9, 5)


def test_a_variable_dim_bounds_nothing() -> None:
    config = model([spec("TYPE_FP32", [-1]), spec("TYPE_FP32", [2], "Z")])
    assert json_bounds.budget(config, 5) is None


def test_max_input_bytes_bounds_variable_inputs() -> None:
    config = model([spec("TYPE_STRING", [-1]), spec("TYPE_FP32", [-1], "Z")], max_input_bytes="400")
    # 400 bytes: at most 100 strings (each a 4-byte length prefix) or 100 FP32 values, each
    # in lists of its own at both levels.
    assert json_bounds.budget(config, 5) == JsonBudget("m", 300 + 300, 5)


def test_tokens_past_the_bound_are_a_400() -> None:
    bounds = JsonBudget("m", 5, 5)
    json_bounds.check(b"[" + b"1," * 9 + b"1]", bounds)
    with pytest.raises(InvalidInput, match="more than 10 commas, lists and objects"):
        json_bounds.check(b"[" + b"1," * 10 + b"1]", bounds)
    with pytest.raises(InvalidInput, match="model 'm' take 5 at most"):
        json_bounds.check(b"[" + b"[[[]]]" * 4 + b"]", bounds)


def test_whitespace_and_commas_in_strings_are_no_tokens() -> None:
    bounds = JsonBudget("m", 5, 5)
    json_bounds.check(b'["' + b",[{" * 1000 + b'"' + b" " * 10_000 + b"]", bounds)


def test_small_bodies_are_not_bounded_at_all() -> None:
    config = model([spec("TYPE_FP32", [1])])
    settings = GatewaySettings(json_extra_items=1000)
    assert json_bounds.for_body(config, settings, 1000) is None
    assert json_bounds.for_body(config, settings, 1001) == JsonBudget("m", 17, 1000)


def reference_count(raw: bytes) -> int:
    inside = escaped = False
    count = 0
    for byte in raw:
        if inside:
            if escaped:
                escaped = False
            elif byte == ord("\\"):
                escaped = True
            elif byte == ord('"'):
                inside = False
        elif byte == ord('"'):
            inside = True
        elif byte in b",[{":
            count += 1
    return count


def json_like(rng: random.Random) -> bytes:
    """Random text of quotes, backslashes and tokens; backslashes only inside strings."""
    out = bytearray()
    inside = False
    for _ in range(rng.randint(0, 40)):
        byte = rng.choice(b'"\\,[{ab')
        if byte == ord("\\"):
            if not inside:
                continue
            out += b"\\" + bytes([rng.choice(b'"\\,a')])
            continue
        inside ^= byte == ord('"')
        out.append(byte)
    return bytes(out)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1024])
def test_the_token_count_skips_strings_across_chunk_boundaries(
    monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(json_bounds, "SCAN_CHUNK_BYTES", chunk)
    rng = random.Random(chunk)
    for _ in range(2000):
        raw = json_like(rng)
        assert json_bounds.tokens_outside_strings(raw) == reference_count(raw), raw


def test_flatten_stops_at_a_level_with_more_items_than_the_limit() -> None:
    data = [[0.5]] * 100
    assert json_text.flatten("X", data, limit=64) == (data, {list})
    assert json_text.flatten("X", data, limit=100) == ([0.5] * 100, {float})


def _structure(value: Any) -> int:
    """Commas, ``[`` and ``{`` that orjson's encoding of ``value`` holds outside strings."""
    if isinstance(value, list):
        return 1 + max(len(value) - 1, 0) + sum(_structure(v) for v in value)
    if isinstance(value, dict):
        return 1 + max(len(value) - 1, 0) + sum(_structure(v) for v in value.values())
    return 0


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(), inner, max_size=6),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUES)
def test_the_count_of_any_json_body_is_its_structure_whatever_its_strings_hold(value: Any) -> None:
    # Strings full of commas, brackets, quotes and backslashes count for nothing.
    raw = orjson.dumps(value)
    assert json_bounds.tokens_outside_strings(raw) == _structure(value)
