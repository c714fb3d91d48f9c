"""epfuse._lib against include/epfuse/c_api.h: every function, argument type, return type, the config
struct, the error codes and the API version. Parses the header, so a change on either side that the
other does not follow fails here (no library or GPU needed)."""

from __future__ import annotations

import ctypes
import re
from typing import Any

import pytest

from conftest import HEADER
from epfuse import _lib, errors

pytestmark = pytest.mark.skipif(not HEADER.exists(), reason=f"{HEADER} not found (not a source checkout)")


def _header_text() -> str:
    text = HEADER.read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)  # block comments
    return re.sub(r"//[^\n]*", " ", text)


# C types of c_api.h -> the ctypes type _lib must declare for them.
_CTYPE_OF: dict[str, Any] = {
    "int": ctypes.c_int,
    "int64_t": ctypes.c_int64,
    "size_t": ctypes.c_size_t,
    "void*": ctypes.c_void_p,
    "const void*": ctypes.c_void_p,
    "const int32_t*": ctypes.c_void_p,
    "const float*": ctypes.c_void_p,
    "const char*": ctypes.c_char_p,
    "int*": ctypes.POINTER(ctypes.c_int),
    "size_t*": ctypes.POINTER(ctypes.c_size_t),
    "epfuse_comm*": ctypes.c_void_p,
    "const epfuse_comm*": ctypes.c_void_p,
    "epfuse_workspace*": ctypes.c_void_p,
    "const epfuse_workspace*": ctypes.c_void_p,
    "epfuse_layer*": ctypes.c_void_p,
    "epfuse_comm**": ctypes.POINTER(ctypes.c_void_p),
    "epfuse_workspace**": ctypes.POINTER(ctypes.c_void_p),
    "epfuse_layer**": ctypes.POINTER(ctypes.c_void_p),
    "const epfuse_layer_config*": ctypes.POINTER(_lib.LayerConfig),
}
_FIELD_CTYPE = {"int32_t": ctypes.c_int32, "float": ctypes.c_float}


def _norm_type(decl: str) -> str:
    """'const epfuse_layer_config* capacity' -> 'const epfuse_layer_config*' (the name dropped)."""
    decl = " ".join(decl.replace("*", " * ").split())
    decl = re.sub(r"\s+[A-Za-z_]\w*$", "", decl) if not decl.endswith("*") else decl
    return decl.replace(" *", "*").replace("* *", "**")


def parse_functions() -> dict[str, tuple[str, list[str]]]:
    """name -> (return type, [parameter types]) for every epfuse_* prototype of the header."""
    text = _header_text()
    protos = re.findall(r"([A-Za-z_][\w\s\*]*?)\b(epfuse_\w+)\s*\(([^)]*)\)\s*;", text)
    out: dict[str, tuple[str, list[str]]] = {}
    for ret, name, params in protos:
        params = " ".join(params.split())
        types = [] if params in ("", "void") else [_norm_type(p.strip()) for p in params.split(",")]
        # Export/visibility macros (all-caps words such as EPFUSE_C_EXPORT) are not part of the type.
        ret_words = [w for w in ret.replace("*", " * ").split() if not re.fullmatch(r"[A-Z][A-Z0-9_]*", w)]
        out[name] = (" ".join(ret_words).replace(" *", "*"), types)
    return out


def test_header_parses() -> None:
    functions = parse_functions()
    # A parser that finds nothing would make the comparisons below pass vacuously.
    assert len(functions) >= 15, functions
    assert functions["epfuse_layer_forward"] == (
        "int",
        ["epfuse_layer*", "const void*", "const int32_t*", "const float*", "int", "void*", "void*"],
    )
    assert functions["epfuse_last_error"] == ("const char*", [])


def test_every_header_function_is_declared_in_lib() -> None:
    header = set(parse_functions())
    declared = set(_lib.SIGNATURES)
    assert header - declared == set(), (
        f"in c_api.h, missing from epfuse/_lib.py SIGNATURES: {sorted(header - declared)}"
    )
    assert declared - header == set(), f"in epfuse/_lib.py SIGNATURES, not in c_api.h: {sorted(declared - header)}"


@pytest.mark.parametrize("name", sorted(_lib.SIGNATURES))
def test_signature_matches_header(name: str) -> None:
    functions = parse_functions()
    if name not in functions:
        pytest.fail(f"{name} is declared in epfuse/_lib.py but not in c_api.h")
    ret, params = functions[name]
    argtypes, restype = _lib.SIGNATURES[name]
    assert len(argtypes) == len(params), f"{name}: c_api.h has {len(params)} parameters {params}, _lib {len(argtypes)}"
    for i, (c_type, declared) in enumerate(zip(params, argtypes)):
        assert c_type in _CTYPE_OF, f"{name}: parameter {i} has C type {c_type!r} this test does not know"
        assert declared is _CTYPE_OF[c_type], f"{name}: parameter {i} ({c_type}) declared as {declared}"
    assert ret in _CTYPE_OF, f"{name}: return type {ret!r} unknown to this test"
    assert restype is _CTYPE_OF[ret], f"{name}: returns {ret}, declared restype {restype}"


def test_config_struct_matches_header() -> None:
    m = re.search(r"typedef struct\s*\{(.*?)\}\s*epfuse_layer_config\s*;", _header_text(), flags=re.S)
    assert m, "epfuse_layer_config not found in c_api.h"
    fields = re.findall(r"(int32_t|float)\s+(\w+)\s*;", m.group(1))
    assert [(n, _FIELD_CTYPE[t]) for t, n in fields] == [(n, t) for n, t in _lib.LayerConfig._fields_]


def test_error_codes_match_header() -> None:
    codes = dict(re.findall(r"\b(EPFUSE_(?:OK|ERR_\w+))\s*=\s*(\d+)", _header_text()))
    assert codes, "no EPFUSE_ERR_* in c_api.h"
    assert {name: int(v) for name, v in codes.items()} == {name: code for code, name in errors.CODE_NAMES.items()}


def test_format_constants_match_header() -> None:
    values = dict(re.findall(r"\b(EPFUSE_(?:WEIGHTS|SCALES)_\w+)\s*=\s*(\d+)", _header_text()))
    assert {name: int(v) for name, v in values.items()} == {
        "EPFUSE_WEIGHTS_BF16": _lib.WEIGHTS_BF16,
        "EPFUSE_WEIGHTS_FP8_BLOCK128": _lib.WEIGHTS_FP8_BLOCK128,
        "EPFUSE_SCALES_FP32": _lib.SCALES_FP32,
        "EPFUSE_SCALES_UE8M0": _lib.SCALES_UE8M0,
    }


def test_api_version_matches_header() -> None:
    m = re.search(r"#define\s+EPFUSE_C_API_VERSION\s+(\d+)", HEADER.read_text())
    assert m
    assert int(m.group(1)) == _lib.C_API_VERSION


def test_library_exports_every_function(lib: Any) -> None:
    for name in parse_functions():
        assert hasattr(lib, name), f"libepfuse_c.so does not export {name}"
