"""Exit codes and the errors dynspec reports to its user.

The engine raises these; only the CLI turns them into exit codes. Anything else that escapes is a
bug in dynspec and exits with ``ExitCode.INTERNAL``.
"""

from __future__ import annotations

import enum
from typing import ClassVar


class ExitCode(enum.IntEnum):
    OK = 0  # done, or nothing to do
    CHANGES = 1  # --check found work to do
    USAGE = 2  # bad command line, or a path that is not an SGLang tree
    DRIFT = 3  # an anchor is gone: SGLang moved under the patch
    REFUSED = 4  # stopped before writing: hand edits, unsupported version, locked tree, ...
    INTERNAL = 123  # a bug in dynspec
    # `dynspec remote`: the ssh side failed before or while talking to the server.
    AUTH = 5  # ssh: the server refused every key we offered
    HOST_KEY = 6  # ssh: the server's host key is unknown or has changed
    UNREACHABLE = 7  # ssh: no such host, connection refused or timed out
    REMOTE_PYTHON = 8  # the server has no python3 >= 3.9 at --python
    CONNECTION_LOST = 9  # the connection broke mid-command; the tree is all old or all new
    DAMAGED = 10  # the state dir is not what dynspec wrote (a link, bad JSON, a missing pre-image)
    # `dynspec real`: the real-weights tools (convert, train, accept).
    MODEL_MISSING = 11  # a model file or dir that should be there is not (or cannot be read)
    MODEL_INVALID = 12  # a model file that is not what was expected: format, architecture, shapes, digest
    INTERRUPTED = 130  # Ctrl-C: the tree is all old, or all new when the write had finished


class DynspecError(Exception):
    """An error dynspec reports to the user in one line. Never a bug."""

    exit_code: ClassVar[ExitCode] = ExitCode.REFUSED


class UsageError(DynspecError):
    """The command line or the --sglang path is wrong."""

    exit_code = ExitCode.USAGE


class NotAnSGLangTree(UsageError):
    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path} is not an SGLang tree: {why}")


class Refused(DynspecError):
    """dynspec stopped before writing anything."""

    exit_code = ExitCode.REFUSED


class AnchorNotFound(DynspecError):
    """A patch's anchor is not in its target: the SGLang tree has drifted."""

    exit_code = ExitCode.DRIFT

    def __init__(self, patch_id: str, anchor: str, target: str, sglang: str) -> None:
        self.patch_id, self.anchor, self.target, self.sglang = patch_id, anchor, target, sglang
        super().__init__(f"{patch_id}: anchor {anchor!r} not found in {target} (SGLang {sglang})")

    def with_note(self, note: str) -> AnchorNotFound:
        """The same error with ``note`` added, e.g. that --sglang-version overrode the tree's version."""
        error = AnchorNotFound(self.patch_id, self.anchor, self.target, self.sglang)
        error.args = (f"{error}; {note}",)
        return error


class DamagedState(DynspecError):
    """The state dir cannot be trusted; nothing was written. The message says how to start over."""

    exit_code = ExitCode.DAMAGED


class ModelMissing(DynspecError):
    """``dynspec real``: a model file or directory is missing or unreadable."""

    exit_code = ExitCode.MODEL_MISSING


class ModelInvalid(DynspecError):
    """``dynspec real``: a model file is damaged or not the model expected (names, shapes, digest)."""

    exit_code = ExitCode.MODEL_INVALID


class Interrupted(DynspecError):
    """Ctrl-C; the message says whether the write had finished."""

    exit_code = ExitCode.INTERRUPTED


class BadTarget(DynspecError):
    """A target file cannot be parsed, or the patched result fails a post-condition."""

    exit_code = ExitCode.REFUSED


# -- dynspec remote -----------------------------------------------------------------------------


class RemoteError(DynspecError):
    """Reaching a server over ssh failed; the message starts with the host."""


class SshAuthFailed(RemoteError):
    exit_code = ExitCode.AUTH


class UnknownHostKey(RemoteError):
    exit_code = ExitCode.HOST_KEY


class HostUnreachable(RemoteError):
    exit_code = ExitCode.UNREACHABLE


class RemotePythonMissing(RemoteError):
    exit_code = ExitCode.REMOTE_PYTHON


class ConnectionLost(RemoteError):
    exit_code = ExitCode.CONNECTION_LOST
