"""Spec files: documents, the line of every field, and every local problem of every document at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucloud_client.errors import EXIT_INVALID, ApiError, FieldError, SpecError, SpecIssue
from gpucloud_client.spec import SpecDocument, group_spec, issues_from_error, load_spec, parse_spec

SWEEP = """\
# a sweep of two
project: vision
name: lr-1
image: pytorch/pytorch:2.4
command:
  - python
  - train.py
  - --lr=0.1
env:
  FOO: "1"
  BAR: two
---
tenant: lab
name: lr-2
image: pytorch/pytorch:2.4
command: python train.py --lr=0.2
gpus_per_replica: 2
"""


def _issues(text: str) -> list[SpecIssue]:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, source="spec.yaml")
    assert caught.value.exit_code == EXIT_INVALID
    return caught.value.issues


def test_documents_give_bodies_tenants_and_positions() -> None:
    first, second = parse_spec(SWEEP, source="spec.yaml")

    assert first.body == {
        "project": "vision",
        "name": "lr-1",
        "image": "pytorch/pytorch:2.4",
        "command": ["python", "train.py", "--lr=0.1"],
        "env": {"FOO": "1", "BAR": "two"},
    }
    assert (first.tenant, first.index, first.number, first.start_line) == (None, 0, 1, 2)
    assert second.tenant == "lab" and "tenant" not in second.body
    assert (second.index, second.start_line, second.source) == (1, 13, "spec.yaml")


def test_line_of_maps_api_field_paths_to_file_lines() -> None:
    first, second = parse_spec(SWEEP)

    assert first.line_of("name") == 3
    assert first.line_of("command") == 5
    assert first.line_of("command[2]") == 8
    assert first.line_of("env.FOO") == 10
    assert first.line_of("env.BAR") == 11
    assert first.line_of("env.MISSING") == 9  # a rule about a variable not written: the line of `env`
    assert first.line_of("command[7]") == 5
    assert first.line_of("pool") is None
    assert second.line_of("gpus_per_replica") == 17
    assert second.line_of("command[1]") == 16  # one string the API splits: its line


def test_load_spec_reads_a_file_and_names_it(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP)

    from_path = load_spec(path)
    from_name = load_spec(str(path))

    assert [d.body["name"] for d in from_path] == ["lr-1", "lr-2"] == [d.body["name"] for d in from_name]
    assert from_path[0].source == str(path)
    assert load_spec("name: x\nimage: y\n")[0].source == "<spec>"


def test_syntax_error_has_line_and_column() -> None:
    (issue,) = _issues("name: a\nimage: [unclosed\ncommand: x\n")

    assert (issue.code, issue.document, issue.line, issue.column) == ("invalid_yaml", 1, 3, 8)
    assert issue.format().startswith("spec.yaml:3:8 (document 1) invalid_yaml: ")


def test_unknown_key_suggests_the_closest_field() -> None:
    (issue,) = _issues("name: a\nimage: b\ngpus_per_replic: 2\n")

    assert (issue.field, issue.code, issue.line) == ("gpus_per_replic", "unknown_field", 3)
    assert "did you mean 'gpus_per_replica'?" in issue.message
    assert issue.format().startswith("spec.yaml:3 (document 1) gpus_per_replic: unknown_field: Unknown field;")


def test_unknown_key_without_a_close_field_lists_the_allowed_ones() -> None:
    (issue,) = _issues("name: a\nprivileged: true\n")

    assert "did you mean" not in issue.message
    assert "allowed: command, cpu_milli," in issue.message


def test_every_container_option_is_named_at_its_line() -> None:
    forbidden = ["privileged", "cap_add", "binds", "volumes", "network_mode", "pid", "ipc", "devices", "security_opt"]
    text = "name: a\nimage: b\n" + "".join(f"{key}: x\n" for key in forbidden)

    issues = _issues(text)

    assert [(i.field, i.code, i.line) for i in issues] == [
        (key, "unknown_field", line) for line, key in enumerate(forbidden, start=3)
    ]


def test_every_problem_of_every_document_at_once() -> None:
    text = "name: a\nimagee: b\n---\n- just\n- a list\n---\nname: [broken\n---\nname: d\nvolumes: [x]\nname: again\n"

    issues = _issues(text)

    assert [(i.document, i.line, i.field, i.code) for i in issues] == [
        (1, 2, "imagee", "unknown_field"),
        (2, 4, "", "not_a_mapping"),
        (3, 8, "", "invalid_yaml"),
        (4, 11, "name", "duplicate_field"),
        (4, 10, "volumes", "unknown_field"),
    ]


def test_empty_spec_is_refused() -> None:
    (issue,) = _issues("# nothing here\n---\n")

    assert issue.code == "empty"


def test_unsafe_tags_are_refused_not_built() -> None:
    (issue,) = _issues("name: !!python/object/apply:os.system ['true']\n")

    assert issue.code == "invalid_yaml" and issue.line == 1


def test_tenant_must_be_a_slug() -> None:
    (issue,) = _issues("tenant: 3\nname: a\n")

    assert (issue.field, issue.code, issue.line) == ("tenant", "invalid", 1)


def _docs() -> list[SpecDocument]:
    return parse_spec("name: a\nimage: b\n---\nname: c\nimage: d\nenv:\n  LD_PRELOAD: x\n---\nproject: p2\nname: e\n")


def test_group_spec_groups_by_tenant_and_project_with_defaults() -> None:
    groups = group_spec(_docs(), tenant="acme", project="vision")

    assert [(g.tenant, g.project, [d.index for d in g.documents]) for g in groups] == [
        ("acme", "vision", [0, 1]),
        ("acme", "p2", [2]),
    ]
    assert groups[0].items()[1] == {"name": "c", "image": "d", "env": {"LD_PRELOAD": "x"}}


def test_group_spec_names_every_document_without_a_project() -> None:
    with pytest.raises(SpecError) as caught:
        group_spec(_docs(), tenant="acme", project=None)

    assert [(i.document, i.field, i.code) for i in caught.value.issues] == [(1, "project", "required")] * 1 + [
        (2, "project", "required")
    ]


def test_bulk_field_errors_map_to_their_documents_lines() -> None:
    docs = _docs()[:2]
    error = ApiError(
        400,
        "validation_error",
        "invalid",
        fields={
            "items[1].env.LD_PRELOAD": [FieldError("forbidden_env", "Not allowed.")],
            "items[0].image": [FieldError("image_not_allowed", "No pattern matches.")],
            "project": [FieldError("max_pending_workloads", "Too many.")],
        },
    )

    issues = issues_from_error(error, docs, bulk=True)

    assert [i.format() for i in issues] == [
        "<spec>:7 (document 2) env.LD_PRELOAD: forbidden_env: Not allowed.",
        "<spec>:2 (document 1) image: image_not_allowed: No pattern matches.",
        "<spec>:1 (document 1) project: max_pending_workloads: Too many.",
    ]


def test_single_document_field_errors_and_errors_without_fields() -> None:
    doc = _docs()[1]
    with_fields = ApiError(400, "validation_error", "bad", fields={"name": [FieldError("invalid_name", "No.")]})
    without = ApiError(400, "bad_request", "Something is off.")

    assert [i.format() for i in issues_from_error(with_fields, [doc], bulk=False)] == [
        "<spec>:4 (document 2) name: invalid_name: No."
    ]
    assert [i.format() for i in issues_from_error(without, [doc], bulk=False)] == [
        "<spec>:4 (document 2) bad_request: Something is off."
    ]
