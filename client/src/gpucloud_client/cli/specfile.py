"""A spec file's whole verdict at once: the local problems AND the API's, before anything is submitted.

A person fixing a file wants every problem in one go: the library's `read_spec` gives the local problems
(YAML syntax, non-mappings, unknown keys) and the documents that are still mappings (their unknown keys
left out), which are also sent to the API's validate endpoints; both lists are reported together, in
file order. Only a file with no problem at all comes back as groups to submit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpucloud_client.client import Client
    from gpucloud_client.errors import SpecIssue
    from gpucloud_client.spec import SpecDocument, SpecGroup


def read_documents(text: str, source: str) -> tuple[list[SpecDocument], list[SpecIssue]]:
    """Return the documents the API can judge and every local issue of the file (none for a clean file)."""
    from gpucloud_client.spec import read_spec

    return read_spec(text, source=source)


def check_file(client: Client, documents: list[SpecDocument], local: list[SpecIssue]) -> list[SpecGroup]:
    """Return the groups to submit when neither the local checks nor the API found a problem.

    Raises SpecError with every issue of every document, sorted by document and line. A failure that is
    about no field (401, 403, 404, 5xx, no connection) is raised as it is, unless there are local issues
    to report: those are then the verdict.
    """
    from gpucloud_client.errors import ClientError, SpecError
    from gpucloud_client.spec import check_spec

    found = list(local)
    groups: list[SpecGroup] = []
    if documents:
        try:
            groups = check_spec(client, documents)
        except SpecError as error:
            found += error.issues
        except ClientError:
            if not local:
                raise  # the API could not judge the file (login, network): that is the whole story
    if found:
        raise SpecError(sorted(found, key=lambda issue: (issue.document, issue.line or 0)))
    return groups
