"""Anchors: named things a patch must find before it may edit. Shared lookups for transforms.

Anchors look at names, never at formatting, and only where the patch will edit (a class body, one
method), so checking them costs little even on SGLang's 9000-line ``server_args.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m


@dataclass(frozen=True)
class Anchor:
    """Something that must exist in the target. ``found`` is a pure function of the module."""

    find: Callable[[cst.Module], bool]

    def found(self, module: cst.Module) -> bool:
        return self.find(module)


def find_class(module: cst.Module, name: str) -> cst.ClassDef | None:
    for statement in module.body:
        if isinstance(statement, cst.ClassDef) and statement.name.value == name:
            return statement
    return None


def find_method(classdef: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    for statement in body_of(classdef):
        if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
            return statement
    return None


def body_of(node: cst.ClassDef | cst.FunctionDef) -> Sequence[cst.BaseStatement]:
    body = node.body
    return body.body if isinstance(body, cst.IndentedBlock) else ()


def is_field(statement: cst.CSTNode, name: str) -> bool:
    return m.matches(statement, m.SimpleStatementLine(body=[m.AnnAssign(target=m.Name(name))]))


def is_call_with_first_arg(statement: cst.CSTNode, literal: str) -> bool:
    """``parser.add_argument("--flag", ...)`` as a statement, matched on its first argument."""
    return m.matches(
        statement,
        m.SimpleStatementLine(
            body=[
                m.Expr(
                    value=m.Call(
                        args=[m.Arg(value=m.SimpleString(value=m.MatchIfTrue(lambda s: _unquote(s) == literal))), m.ZeroOrMore()]
                    )
                )
            ]
        ),
    )


def _unquote(token: str) -> str:
    return token.strip("'\"")


def class_field(class_name: str, field: str) -> Anchor:
    """The class ``class_name`` declares ``field: ...``."""

    def find(module: cst.Module) -> bool:
        classdef = find_class(module, class_name)
        return classdef is not None and any(is_field(s, field) for s in body_of(classdef))

    return Anchor(find)


def method(class_name: str, method_name: str) -> Anchor:
    def find(module: cst.Module) -> bool:
        classdef = find_class(module, class_name)
        return classdef is not None and find_method(classdef, method_name) is not None

    return Anchor(find)


def method_statement(class_name: str, method_name: str, predicate: Callable[[cst.CSTNode], bool]) -> Anchor:
    """A top-level statement of ``class_name.method_name`` satisfies ``predicate``."""

    def find(module: cst.Module) -> bool:
        classdef = find_class(module, class_name)
        function = find_method(classdef, method_name) if classdef else None
        return function is not None and any(predicate(s) for s in body_of(function))

    return Anchor(find)


def module_function(name: str) -> Anchor:
    def find(module: cst.Module) -> bool:
        return any(isinstance(s, cst.FunctionDef) and s.name.value == name for s in module.body)

    return Anchor(find)


def imports_name(name: str) -> Anchor:
    """A top-level ``from x import ..., name, ...`` brings ``name`` into the module."""

    def find(module: cst.Module) -> bool:
        for statement in module.body:
            if m.matches(statement, m.SimpleStatementLine(body=[m.ImportFrom()])):
                node = statement.body[0]  # type: ignore[attr-defined]
                if not isinstance(node.names, cst.ImportStar):
                    if any(isinstance(a.name, cst.Name) and a.name.value == name for a in node.names):
                        return True
        return False

    return Anchor(find)


# -- editing helpers ----------------------------------------------------------------------------


def replace_class(module: cst.Module, name: str, edit: Callable[[cst.ClassDef], cst.ClassDef]) -> cst.Module:
    body = [edit(s) if isinstance(s, cst.ClassDef) and s.name.value == name else s for s in module.body]
    return module.with_changes(body=body)


def replace_method(
    classdef: cst.ClassDef, name: str, edit: Callable[[cst.FunctionDef], cst.FunctionDef]
) -> cst.ClassDef:
    return with_body(
        classdef,
        [edit(s) if isinstance(s, cst.FunctionDef) and s.name.value == name else s for s in body_of(classdef)],
    )


def with_body(node: cst.ClassDef | cst.FunctionDef, statements: Sequence[cst.BaseStatement]) -> cst.ClassDef | cst.FunctionDef:
    block = cst.ensure_type(node.body, cst.IndentedBlock)
    return node.with_changes(body=block.with_changes(body=list(statements)))


def insert_after(
    statements: Sequence[cst.BaseStatement],
    predicate: Callable[[cst.BaseStatement], bool],
    new: Sequence[cst.BaseStatement],
) -> list[cst.BaseStatement]:
    """Insert ``new`` after the first statement matching ``predicate``."""
    out: list[cst.BaseStatement] = []
    inserted = False
    for statement in statements:
        out.append(statement)
        if not inserted and predicate(statement):
            out.extend(new)
            inserted = True
    return out
