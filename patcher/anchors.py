"""Anchors: named things a patch must find before it may edit. Shared lookups for transforms.

Anchors look at names, never at formatting, and only where the patch will edit (a class body, one
method), so checking them costs little even on SGLang's 9000-line ``server_args.py``.

The predicates are plain ``isinstance`` checks: importing ``libcst.matchers`` alone takes 0.4 s,
a third of the time budget of a whole ``dynspec apply``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import libcst as cst


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


def method_of(module: cst.Module, class_name: str, method_name: str) -> cst.FunctionDef | None:
    """``class_name.method_name`` of a top-level class, else None."""
    classdef = find_class(module, class_name)
    return find_method(classdef, method_name) if classdef else None


def body_of(node: cst.ClassDef | cst.FunctionDef) -> Sequence[cst.BaseStatement]:
    body = node.body
    return body.body if isinstance(body, cst.IndentedBlock) else ()


def leading_lines(statement: cst.BaseStatement) -> Sequence[cst.EmptyLine]:
    """The comment and blank lines libcst attaches to the start of ``statement``."""
    if isinstance(statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
        return statement.leading_lines
    return ()


def single_small_statement(statement: cst.CSTNode) -> cst.BaseSmallStatement | None:
    """The one small statement on a line (``x: int = 1``, ``f(x)``), else None."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        return statement.body[0]
    return None


def is_field(statement: cst.CSTNode, name: str) -> bool:
    """``name: annotation [= default]`` as a line of a class body."""
    small = single_small_statement(statement)
    return isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.target.value == name


def is_assignment_to(statement: cst.CSTNode, dotted: str) -> bool:
    """``dotted = ...`` (``self.x = ...`` for ``"self.x"``) as a line of its own."""
    small = single_small_statement(statement)
    if not isinstance(small, (cst.Assign, cst.AnnAssign)):
        return False
    targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
    return any(dotted_name(t) == dotted for t in targets)


def dotted_name(node: cst.CSTNode) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted_name(node.value)
        return None if head is None else f"{head}.{node.attr.value}"
    return None


def is_docstring(statement: cst.CSTNode) -> bool:
    small = single_small_statement(statement)
    return isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString))


def after_docstring(body: Sequence[cst.BaseStatement]) -> int:
    """Where statements go to open ``body``: after its docstring, if it has one."""
    return 1 if body and is_docstring(body[0]) else 0


class _CallFinder(cst.CSTVisitor):
    def __init__(self, attribute: str) -> None:
        self.attribute = attribute
        self.found = False

    def visit_Call(self, node: cst.Call) -> bool:
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == self.attribute:
            self.found = True
        return not self.found


def calls(node: cst.CSTNode, attribute: str) -> bool:
    """``node`` contains a call ``<anything>.<attribute>(...)``."""
    finder = _CallFinder(attribute)
    node.visit(finder)
    return finder.found


def is_call_with_first_arg(statement: cst.CSTNode, literal: str) -> bool:
    """``parser.add_argument("--flag", ...)`` as a statement, matched on its first argument."""
    small = single_small_statement(statement)
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and small.value.args):
        return False
    first = small.value.args[0].value
    return isinstance(first, cst.SimpleString) and first.evaluated_value == literal


def subscript_calls(statement: cst.CSTNode) -> list[str]:
    """For a field ``x: A[T, "help", NS("spec")]``, the names called inside ``A[...]``: ``["NS"]``."""
    small = single_small_statement(statement)
    if not isinstance(small, cst.AnnAssign) or not isinstance(small.annotation.annotation, cst.Subscript):
        return []
    names = []
    for element in small.annotation.annotation.slice:
        if isinstance(element.slice, cst.Index) and isinstance(element.slice.value, cst.Call):
            name = dotted_name(element.slice.value.func)
            if name:
                names.append(name)
    return names


def annotation_head(statement: cst.CSTNode) -> str | None:
    """``A`` for ``x: A[...]``, ``Optional`` for ``x: Optional[int]``, ``int`` for ``x: int``."""
    small = single_small_statement(statement)
    if not isinstance(small, cst.AnnAssign):
        return None
    annotation = small.annotation.annotation
    return dotted_name(annotation.value if isinstance(annotation, cst.Subscript) else annotation)


def class_field(class_name: str, field: str) -> Anchor:
    """The class ``class_name`` declares ``field: ...``."""

    def find(module: cst.Module) -> bool:
        classdef = find_class(module, class_name)
        return classdef is not None and any(is_field(s, field) for s in body_of(classdef))

    return Anchor(find)


def class_attribute(class_name: str, name: str) -> Anchor:
    """The body of class ``class_name`` assigns ``name = ...``."""

    def find(module: cst.Module) -> bool:
        classdef = find_class(module, class_name)
        return classdef is not None and any(is_assignment_to(s, name) for s in body_of(classdef))

    return Anchor(find)


def method(class_name: str, method_name: str) -> Anchor:
    def find(module: cst.Module) -> bool:
        return method_of(module, class_name, method_name) is not None

    return Anchor(find)


def method_taking_an_argument(class_name: str, method_name: str) -> Anchor:
    """``class_name.method_name(self, x, ...)``: a parameter besides ``self``."""

    def find(module: cst.Module) -> bool:
        function = method_of(module, class_name, method_name)
        return function is not None and len(function.params.params) >= 2

    return Anchor(find)


def method_statement(class_name: str, method_name: str, predicate: Callable[[cst.CSTNode], bool]) -> Anchor:
    """A top-level statement of ``class_name.method_name`` satisfies ``predicate``."""

    def find(module: cst.Module) -> bool:
        function = method_of(module, class_name, method_name)
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
            small = single_small_statement(statement)
            if (
                isinstance(small, cst.ImportFrom)
                and not isinstance(small.names, cst.ImportStar)
                and any(isinstance(a.name, cst.Name) and a.name.value == name for a in small.names)
            ):
                return True
        return False

    return Anchor(find)


# -- editing helpers ----------------------------------------------------------------------------


def replace_class(module: cst.Module, name: str, edit: Callable[[cst.ClassDef], cst.ClassDef]) -> cst.Module:
    """``module`` with the class ``find_class`` finds (the first of that name) edited."""
    found = find_class(module, name)
    return module.with_changes(body=[edit(s) if s is found else s for s in module.body])


def replace_method(
    classdef: cst.ClassDef, name: str, edit: Callable[[cst.FunctionDef], cst.FunctionDef]
) -> cst.ClassDef:
    return with_body(
        classdef,
        [edit(s) if isinstance(s, cst.FunctionDef) and s.name.value == name else s for s in body_of(classdef)],
    )


Block = TypeVar("Block", cst.ClassDef, cst.FunctionDef)


def with_body(node: Block, statements: Sequence[cst.BaseStatement]) -> Block:
    """``node`` (a class or a function) with ``statements`` as its body."""
    block = cst.ensure_type(node.body, cst.IndentedBlock)
    return node.with_changes(body=block.with_changes(body=list(statements)))


def append_to(function: cst.FunctionDef, statements: Sequence[cst.BaseStatement]) -> cst.FunctionDef:
    return with_body(function, [*body_of(function), *statements])


def prepend_to(function: cst.FunctionDef, statements: Sequence[cst.BaseStatement]) -> cst.FunctionDef:
    """Insert at the top of the body, after the docstring."""
    body = list(body_of(function))
    at = after_docstring(body)
    return with_body(function, [*body[:at], *statements, *body[at:]])


def with_class_attribute(classdef: cst.ClassDef, statements: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """The class body with ``statements`` first (after a docstring), a blank line after them."""
    body = list(body_of(classdef))
    at = after_docstring(body)
    rest = body[at:]
    if rest and not any(not line.comment for line in leading_lines(rest[0])):
        rest[0] = rest[0].with_changes(leading_lines=[cst.EmptyLine(indent=False), *leading_lines(rest[0])])
    return [*body[:at], *statements, *rest]


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


def insert_before(
    statements: Sequence[cst.BaseStatement],
    predicate: Callable[[cst.BaseStatement], bool],
    new: Sequence[cst.BaseStatement],
) -> list[cst.BaseStatement]:
    """Insert ``new`` before the first statement matching ``predicate``."""
    at = next((i for i, statement in enumerate(statements) if predicate(statement)), None)
    return list(statements) if at is None else [*statements[:at], *new, *statements[at:]]
