"""What can go wrong talking to a console, and the exit code each failure gives the `gpc` CLI.

Exit codes (documented in docs/cli.md) are part of the CLI's contract with scripts: never renumber them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1  # generic failure, or a waited-for workload failed without an exit code
EXIT_USAGE = 2  # click's own code for a bad command line
EXIT_INVALID = 3  # the API answered 400, or a spec file does not validate
EXIT_AUTH = 4  # 401/403, or no login (no context, no token)
EXIT_NOT_FOUND = 5  # 404
EXIT_CONFLICT = 6  # 409
EXIT_UNAVAILABLE = 7  # connection failed, 5xx, or 429 after every retry
EXIT_CANCELLED = 8  # a waited-for workload was cancelled
EXIT_LOST = 9  # a waited-for workload was lost
EXIT_INTERRUPTED = 130  # Ctrl-C

_EXIT_BY_STATUS = {400: EXIT_INVALID, 401: EXIT_AUTH, 403: EXIT_AUTH, 404: EXIT_NOT_FOUND, 409: EXIT_CONFLICT}


def exit_code_for_status(status: int) -> int:
    """Return the CLI exit code of an HTTP status (a 4xx not named maps to EXIT_INVALID, 5xx to UNAVAILABLE)."""
    if status in _EXIT_BY_STATUS:
        return _EXIT_BY_STATUS[status]
    if status == 429 or status >= 500:
        return EXIT_UNAVAILABLE
    return EXIT_INVALID if 400 <= status < 500 else EXIT_FAILED


def exit_code_for_workload(state: str, exit_code: int | None) -> int:
    """Return what `gpc submit --wait` exits with once a workload stopped in `state`.

    The workload's own exit code when it ended with one; otherwise succeeded and hibernated give 0,
    cancelled EXIT_CANCELLED, lost EXIT_LOST, anything else (failed) EXIT_FAILED.
    """
    if exit_code is not None and state in {"succeeded", "failed"}:
        # A process exit code is 0..255 where it matters to a shell; a signal death arrives negative.
        return exit_code if 0 <= exit_code <= 255 else EXIT_FAILED
    return {"succeeded": EXIT_OK, "hibernated": EXIT_OK, "cancelled": EXIT_CANCELLED, "lost": EXIT_LOST}.get(
        state, EXIT_FAILED
    )


@dataclass(frozen=True)
class FieldError:
    """One rule a field broke: `code` is the rule (`required`, `out_of_range`, ...), `message` the words."""

    code: str
    message: str


class ClientError(Exception):
    """A failure the client reports to a person: its message never contains a token.

    `exit_code` is what the CLI exits with for it.
    """

    exit_code: int = EXIT_FAILED

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(ClientError):
    """The contexts file is missing, unsafe or malformed, or names no usable context."""

    exit_code = EXIT_AUTH


class ConnectionFailed(ClientError):
    """The console could not be reached (or kept answering 5xx/429) after every retry."""

    exit_code = EXIT_UNAVAILABLE


class ApiError(ClientError):
    """A non-2xx answer of the API, read from its error envelope.

    `fields` maps an API field path (`name`, `env.FOO`, `items[2].image`) to every rule it broke.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        fields: dict[str, list[FieldError]] | None = None,
        request_id: str | None = None,
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, exit_code=exit_code_for_status(status))
        self.status = status
        self.code = code
        self.fields: dict[str, list[FieldError]] = fields or {}
        self.request_id = request_id
        self.details: dict[str, Any] = details or {}
        self.retry_after = retry_after

    def field_lines(self) -> list[str]:
        """Return one `<field>: <rule code>: <message>` line per broken rule, fields in the API's order."""
        return [f"{path}: {err.code}: {err.message}" for path, errors in self.fields.items() for err in errors]

    def __str__(self) -> str:
        return "\n".join([self.message, *(f"  {line}" for line in self.field_lines())])


@dataclass(frozen=True)
class SpecIssue:
    """One problem of a spec file: where it is (document, line, column) and which rule it broke.

    `document` counts from 1 as people do; `line` and `column` too (None when unknown). `field` is the
    API field path (empty for a problem of the whole document).
    """

    source: str
    document: int
    line: int | None
    field: str
    code: str
    message: str
    column: int | None = None

    def format(self) -> str:
        """Return the issue as `spec.yaml:7 (document 2) gpus_per_replica: out_of_range: message`."""
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        if self.line is not None and self.column is not None:
            where += f":{self.column}"
        subject = f"{self.field}: " if self.field else ""
        return f"{where} (document {self.document}) {subject}{self.code}: {self.message}"


class SpecError(ClientError):
    """A spec file that cannot be submitted; `issues` lists every problem of every document at once."""

    def __init__(self, issues: list[SpecIssue]) -> None:
        count = len(issues)
        super().__init__(f"the spec has {count} problem{'s' if count != 1 else ''}", exit_code=EXIT_INVALID)
        self.issues = issues

    def __str__(self) -> str:
        return "\n".join([self.message, *(f"  {issue.format()}" for issue in self.issues)])
