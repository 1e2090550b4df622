"""Spec files: YAML workloads, one per document (`---` between several), turned into submission bodies.

A document's keys are the API's submission fields, exactly (`SUBMISSION_FIELDS`), plus `tenant` (the
context's by default); `project` defaults to the context's. Volumes are no option: every workload mounts
its owner's home, its project's volumes and datasets (docs/storage.md).

`load_spec` checks only what the API cannot see: YAML syntax (with line and column), documents that are
not mappings, unknown and repeated keys (with a "did you mean"), reporting every problem of every document
at once. Everything else is the API's to judge: `check_spec` sends the documents to the validate endpoints
and maps every field the API names back to its line in the file; `submit_spec` submits once all pass.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucloud_client.errors import ApiError, SpecError, SpecIssue
from gpucloud_client.transport import new_idempotency_key

if TYPE_CHECKING:
    from yaml.nodes import Node

    from gpucloud_client.client import Client
    from gpucloud_client.models import Workload

SUBMISSION_FIELDS = (
    "project", "name", "pool", "kind", "image", "command", "env", "gpus_per_replica", "replicas", "gpu_models",
    "cpu_milli", "memory_mib", "shm_mib", "priority_class", "max_runtime_seconds", "requeue_limit", "stop_signal",
    "preset",
)  # fmt: skip
SPEC_FIELDS = (*SUBMISSION_FIELDS, "tenant")
_DOCUMENT_START = re.compile(r"^---(\s|$)")
_ITEM = re.compile(r"^items\[(\d+)\](?:\.(.+))?$")


@dataclass
class SpecDocument:
    """One workload of a spec file: its submission `body`, its `tenant` (None: the context's) and where
    it is (`index` from 0 in the file, `start_line` of its first line, `source` the file's name)."""

    body: dict[str, Any]
    tenant: str | None
    index: int
    source: str = "<spec>"
    start_line: int = 1
    lines: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def number(self) -> int:
        """Return the document's number as people count (from 1)."""
        return self.index + 1

    def line_of(self, field_path: str) -> int | None:
        """Return the file line of an API field path (`name`, `env.FOO`, `command[2]`).

        A path the file does not spell (a rule about the whole of `env`, or a key inside a string the API
        split) gives the line of its nearest written parent; a field the document leaves out gives None.
        """
        path = field_path
        while path:
            if path in self.lines:
                return self.lines[path]
            path = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", path) if re.search(r"[.\[]", path) else ""
        return None

    def issue(self, field_path: str, code: str, message: str) -> SpecIssue:
        """Return an issue of this document about `field_path` (at the document's start when not written)."""
        line = self.line_of(field_path) if field_path else None
        return SpecIssue(self.source, self.number, line or self.start_line, field_path, code, message)


def load_spec(path_or_text: str | Path, *, source: str | None = None) -> list[SpecDocument]:
    """Return the documents of a spec file (a Path, or a str naming an existing file) or of YAML text.

    Raises SpecError listing every local problem of every document (see the module).
    """
    if isinstance(path_or_text, Path) or ("\n" not in path_or_text and Path(path_or_text).is_file()):
        where = Path(path_or_text)
        return parse_spec(where.read_text(encoding="utf-8"), source=source or str(where))
    return parse_spec(path_or_text, source=source or "<spec>")


def parse_spec(text: str, *, source: str = "<spec>") -> list[SpecDocument]:
    """Return the documents of YAML `text`; raises SpecError with every local problem (see the module)."""
    documents, issues = read_spec(text, source=source)
    if issues:
        raise SpecError(issues)
    return documents


def read_spec(text: str, *, source: str = "<spec>") -> tuple[list[SpecDocument], list[SpecIssue]]:
    """Return the documents of YAML `text` the API can still judge, and every local problem of the file.

    A document with local problems is returned when it is a mapping, without
    its unknown keys, so that one report can hold the file's local problems
    and the API's verdict on the rest. Documents are numbered as people see
    them: every non-empty one, broken ones included.
    """
    documents: list[SpecDocument] = []
    issues: list[SpecIssue] = []
    position = 0
    for offset, chunk in _chunks(text):
        node, syntax = _compose(chunk, offset, source, position + 1)
        if syntax is None and node is None:
            continue  # only comments or blank lines
        if syntax is not None:
            issues.append(syntax)
        else:
            assert node is not None  # for mypy: one of the two is set
            document, found = _document(node, chunk, offset, source, position)
            issues.extend(found)
            if document is not None:
                document.body = {key: value for key, value in document.body.items() if key in SUBMISSION_FIELDS}
                documents.append(document)
        position += 1
    if not documents and not issues:
        issues.append(SpecIssue(source, 1, None, "", "empty", "The spec holds no workload."))
    return documents, issues


def _chunks(text: str) -> list[tuple[int, str]]:
    """Return (line offset, text) of each document: a line starting with `---` starts one."""
    chunks: list[tuple[int, list[str]]] = [(0, [])]
    for number, line in enumerate(text.splitlines(keepends=True)):
        if _DOCUMENT_START.match(line) and any(part.strip() for part in chunks[-1][1]):
            chunks.append((number, []))
        chunks[-1][1].append(line)
    return [(offset, "".join(lines)) for offset, lines in chunks]


def _compose(chunk: str, offset: int, source: str, number: int) -> tuple[Node | None, SpecIssue | None]:
    import yaml

    try:
        node = yaml.compose(chunk, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        words = " ".join(part for part in (error.context, error.problem) if part) or "not valid YAML"
        line = mark.line + 1 + offset if mark else None
        column = mark.column + 1 if mark else None
        return None, SpecIssue(source, number, line, "", "invalid_yaml", words, column)
    except yaml.YAMLError as error:
        return None, SpecIssue(source, number, offset + 1, "", "invalid_yaml", str(error))
    # A bare `---` (a trailing one, say) is an empty document: nothing to submit, nothing wrong.
    empty = isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null" and node.value == ""
    return (None if empty else node), None


def _document(
    node: Node, chunk: str, offset: int, source: str, index: int
) -> tuple[SpecDocument | None, list[SpecIssue]]:
    import yaml

    start = node.start_mark.line + 1 + offset
    if not isinstance(node, yaml.MappingNode):
        message = "A workload is a mapping of fields (name: ..., image: ...)."
        return None, [SpecIssue(source, index + 1, start, "", "not_a_mapping", message)]
    lines: dict[str, int] = {}
    issues: list[SpecIssue] = []
    _map_lines(node, "", offset, lines, issues, source, index + 1)
    try:
        data = yaml.safe_load(chunk)
    except yaml.YAMLError as error:  # a tag PyYAML's safe loader will not build, e.g. !!python/object
        mark = getattr(error, "problem_mark", None)
        line = mark.line + 1 + offset if mark else start
        return None, [*issues, SpecIssue(source, index + 1, line, "", "invalid_yaml", str(error).splitlines()[0])]
    for key in data:
        if key not in SPEC_FIELDS:
            issues.append(SpecIssue(source, index + 1, lines.get(str(key)), str(key), "unknown_field", _unknown(key)))
    tenant = data.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        issues.append(SpecIssue(source, index + 1, lines["tenant"], "tenant", "invalid", "Must be a tenant's slug."))
    body = {key: value for key, value in data.items() if key != "tenant"}
    document = SpecDocument(body, tenant if isinstance(tenant, str) else None, index, source, start, lines)
    return document, issues


def _map_lines(
    node: Node, prefix: str, offset: int, lines: dict[str, int], issues: list[SpecIssue], source: str, number: int
) -> None:
    """Record the line of every key and list item under `node` as an API field path."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            line = key_node.start_mark.line + 1 + offset
            if path in lines:
                issues.append(SpecIssue(source, number, line, path, "duplicate_field", "Given more than once."))
            lines[path] = line
            _map_lines(value_node, path, offset, lines, issues, source, number)
    elif isinstance(node, yaml.SequenceNode):
        for position, item in enumerate(node.value):
            path = f"{prefix}[{position}]"
            lines[path] = item.start_mark.line + 1 + offset
            _map_lines(item, path, offset, lines, issues, source, number)


def _unknown(key: Any) -> str:
    allowed = ", ".join(sorted(SPEC_FIELDS))
    close = difflib.get_close_matches(str(key), SPEC_FIELDS, n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"Unknown field; {hint}allowed: {allowed}."


# --- with the API ---------------------------------------------------------------------------


@dataclass
class SpecGroup:
    """Documents submitted together: the same tenant and project (one bulk request when several)."""

    tenant: str | None
    project: str
    documents: list[SpecDocument]
    budget_notes: list[str] = field(default_factory=list)  # what the API's validation said of the budgets

    def items(self) -> list[dict[str, Any]]:
        """Return the documents' bodies as bulk items (the project is the group's)."""
        return [{k: v for k, v in doc.body.items() if k != "project"} for doc in self.documents]


def group_spec(documents: list[SpecDocument], *, tenant: str | None, project: str | None) -> list[SpecGroup]:
    """Return the documents by (tenant, project), defaults filled in, in file order of their first document.

    Raises SpecError naming every document that has no project anywhere (file, --project, context).
    """
    groups: dict[tuple[str | None, str], SpecGroup] = {}
    issues: list[SpecIssue] = []
    for doc in documents:
        slug = doc.body.get("project", project)
        if not isinstance(slug, str) or not slug:
            message = "Name the project here, with --project, or in the context (gpc login --project)."
            issues.append(doc.issue("project", "required", message))
            continue
        key = (doc.tenant or tenant, slug)
        groups.setdefault(key, SpecGroup(key[0], slug, [])).documents.append(doc)
    if issues:
        raise SpecError(issues)
    return list(groups.values())


def check_spec(client: Client, documents: list[SpecDocument]) -> list[SpecGroup]:
    """Have the API validate every document (writing nothing); return the groups to submit, each with what
    the budgets over its project say of it.

    Raises SpecError with every issue of every document, each at its line; an error that is about no
    field of a document (401, 403, 404, 5xx) is raised as the ApiError it is.
    """
    groups = group_spec(documents, tenant=client.tenant, project=client.context.project)
    issues: list[SpecIssue] = []
    for group in groups:
        scoped = client.for_tenant(group.tenant)
        try:
            if len(group.documents) == 1:
                group.budget_notes = scoped.validate({**group.documents[0].body, "project": group.project})
            else:
                group.budget_notes = scoped.validate_bulk(group.project, group.items())
        except ApiError as error:
            if error.status != 400:
                raise
            issues.extend(issues_from_error(error, group.documents, bulk=len(group.documents) > 1))
    if issues:
        raise SpecError(sorted(issues, key=lambda issue: (issue.document, issue.line or 0)))
    return groups


def submit_spec(client: Client, groups: list[SpecGroup], *, idempotency_key: str | None = None) -> list[Workload]:
    """Submit the checked groups (`check_spec`) and return the workloads in file order.

    Each group's Idempotency-Key derives from `idempotency_key` (a new one when None), so running the same
    command again with the same key submits nothing twice.
    """
    base = idempotency_key or new_idempotency_key()
    placed: list[tuple[int, Workload]] = []
    for number, group in enumerate(groups):
        scoped, key = client.for_tenant(group.tenant), f"{base}-{number}"
        if len(group.documents) == 1:
            body = {**group.documents[0].body, "project": group.project}
            workloads = [scoped.submit(body, idempotency_key=key)]
        else:
            workloads = scoped.submit_bulk(group.project, group.items(), idempotency_key=key)
        placed.extend(zip((doc.index for doc in group.documents), workloads, strict=True))
    return [workload for _, workload in sorted(placed, key=lambda pair: pair[0])]


def issues_from_error(error: ApiError, documents: list[SpecDocument], *, bulk: bool) -> list[SpecIssue]:
    """Return the API's field errors as issues of `documents` (bulk: `items[<i>].<field>` is document i)."""
    issues: list[SpecIssue] = []
    for path, errors in error.fields.items():
        doc, field_path = documents[0], path
        match = _ITEM.match(path) if bulk else None
        if match and int(match.group(1)) < len(documents):
            doc, field_path = documents[int(match.group(1))], match.group(2) or ""
        issues.extend(doc.issue(field_path, item.code, item.message) for item in errors)
    if not issues:
        issues.append(documents[0].issue("", error.code, error.message))
    return issues
