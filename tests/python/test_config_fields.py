"""The one LayerConfig field list (src/common/config_fields.h, EPFUSE_LAYER_CONFIG_FIELDS) against its
copies on the Python side: c_api.h's epfuse_layer_config, epfuse/_lib.py's LayerConfig._fields_ and
the package's LayerConfig(...) calls. Parses the sources, so no library or GPU is needed; the C++
side (the C struct's layout, the conversion) is checked at compile time by src/capi/config_c.h."""

from __future__ import annotations

import ast
import ctypes
import re
from pathlib import Path

import pytest

from conftest import HEADER, REPO_ROOT
from epfuse import _lib

FIELDS_HEADER = REPO_ROOT / "src" / "common" / "config_fields.h"
PACKAGE = REPO_ROOT / "python" / "epfuse"

pytestmark = pytest.mark.skipif(
    not (FIELDS_HEADER.exists() and HEADER.exists()), reason=f"{FIELDS_HEADER} not found (not a source checkout)"
)

# The list's C types -> the ctypes type _lib declares for them.
_CTYPE = {"int32_t": ctypes.c_int32, "float": ctypes.c_float}


def list_fields() -> list[tuple[str, str, str]]:
    """(name, C type, doc) of every X(...) entry of EPFUSE_LAYER_CONFIG_FIELDS, in order."""
    lines = FIELDS_HEADER.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"\s*#define\s+EPFUSE_LAYER_CONFIG_FIELDS\(X\)", line)]
    assert len(starts) == 1, f"EPFUSE_LAYER_CONFIG_FIELDS is not defined once in {FIELDS_HEADER}"
    body_lines = []
    for line in lines[starts[0] :]:  # the macro: up to its first line without a continuation
        body_lines.append(line.rstrip().removesuffix("\\"))
        if not line.rstrip().endswith("\\"):
            break
    body = "\n".join(body_lines).split("(X)", 1)[1]
    entries = re.findall(r'\bX\(\s*(\w+)\s*,\s*(\w+)\s*,\s*"((?:[^"\\]|\\.)*)"\s*\)', body)
    # Every X( of the macro must have been read: an entry this pattern missed would drop a field silently.
    assert len(entries) == body.count("X("), f"unparsed entries in EPFUSE_LAYER_CONFIG_FIELDS: {body}"
    return entries


def header_fields() -> list[tuple[str, str]]:
    """(name, C type) of c_api.h's epfuse_layer_config, in order."""
    text = re.sub(r"/\*.*?\*/", " ", HEADER.read_text(), flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    m = re.search(r"typedef struct\s*\{(.*?)\}\s*epfuse_layer_config\s*;", text, flags=re.S)
    assert m, "epfuse_layer_config not found in c_api.h"
    members = [d.strip() for d in m.group(1).split(";") if d.strip()]
    out = []
    for decl in members:
        dm = re.fullmatch(r"(\w+)\s+(\w+)", " ".join(decl.split()))
        assert dm, f"epfuse_layer_config member {decl!r} is not '<type> <name>'"
        out.append((dm.group(2), dm.group(1)))
    return out


def test_list_parses() -> None:
    fields = list_fields()
    # A parser that finds nothing would make the comparisons below pass vacuously.
    assert len(fields) >= 9, fields
    assert fields[0][:2] == ("hidden", "int32_t")
    names = [name for name, _, _ in fields]
    assert len(set(names)) == len(names), f"a field is listed twice: {names}"
    for name, c_type, doc in fields:
        assert c_type in _CTYPE, f"{name}: C type {c_type!r} this test does not know"
        assert doc.strip(), f"{name} has no doc"


def test_c_header_struct_is_the_list() -> None:
    assert header_fields() == [(name, c_type) for name, c_type, _ in list_fields()]


def test_lib_fields_are_the_list() -> None:
    expected = [(name, _CTYPE[c_type]) for name, c_type, _ in list_fields()]
    assert [(name, t) for name, t in _lib.LayerConfig._fields_] == expected


def test_lib_struct_layout() -> None:
    # Nine 4-byte fields, no padding: the C ABI's layout (config_c.h asserts the same of the C struct).
    offset = 0
    for name, t in _lib.LayerConfig._fields_:
        assert getattr(_lib.LayerConfig, name).offset == offset, name
        offset += ctypes.sizeof(t)
    assert ctypes.sizeof(_lib.LayerConfig) == offset


def _layer_config_calls() -> list[tuple[Path, ast.Call]]:
    calls = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name == "LayerConfig":
                calls.append((path, node))
    return calls


def test_package_builds_configs_by_field_name() -> None:
    # ctypes takes unknown keywords silently (as plain attributes) and positional values by order, so
    # the package names every field, and only fields of the list.
    calls = _layer_config_calls()
    assert calls, f"no LayerConfig(...) call found under {PACKAGE}"
    names = [name for name, _, _ in list_fields()]
    for path, call in calls:
        where = f"{path.name}:{call.lineno}"
        assert not call.args, f"{where}: LayerConfig(...) with positional values; pass every field by name"
        given = [k.arg for k in call.keywords]
        assert None not in given, f"{where}: LayerConfig(**...): pass every field by name"
        assert sorted(given) == sorted(names), f"{where}: LayerConfig fields {given}, the list has {names}"
