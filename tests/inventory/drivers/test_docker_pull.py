"""The Docker runtime pulls an image a start finds missing, says how the pull goes, and keeps to the start's budget.

Images come from a private registry on 127.0.0.1 (tests/jobs/registry.py),
pushed from the locally built test image plus a layer of random bytes and
then removed locally, so the engine really downloads that layer. A
`SlowLink` between engine and registry makes the download take seconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from itertools import pairwise

import pytest

from inventory.drivers.base import DriverTimeout, PermanentDriverError, PullProgress
from inventory.drivers.docker import DockerRuntime
from inventory.drivers.docker._pull import REPORT_SECONDS
from tests.inventory.drivers.conftest import SpecFactory, wait_for
from tests.jobs.registry import (
    Registry,
    SlowLink,
    docker,
    push_unique_image,
    remove_image,
    running_registry,
    slow_image_of,
)

pytestmark = [pytest.mark.docker, pytest.mark.registry]

MB = 1024 * 1024


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("registry")) as serving:
        yield serving


@pytest.fixture
def slow_image(registry: Registry, test_image: str) -> Iterator[str]:
    """A 4 MB image that is not on the engine, pulled through a link passing 2 MB a second."""
    with slow_image_of(registry, test_image) as ref:
        yield ref


def _present(ref: str) -> bool:
    try:
        docker("image", "inspect", ref)
    except Exception:
        return False
    return True


def test_a_start_pulls_a_missing_image_reporting_layers_and_bytes_about_once_a_second(
    slow_image: str, docker_spec: SpecFactory
) -> None:
    runtime = DockerRuntime(pull_images=True)
    reports: list[PullProgress] = []
    handle = runtime.start(docker_spec(["sh", "-c", "echo pulled"], image=slow_image), on_pull=reports.append)
    assert wait_for(lambda: runtime.poll(handle).state == "exited")
    assert runtime.poll(handle).exit_code == 0

    first, *along, last = reports
    assert (first.image, first.seconds < 0.5, first.layers_total, first.done) == (slow_image, True, 0, False)
    assert last.done and last.image == slow_image
    assert (last.layers_done, last.layers_total) == (2, 2), "the base layer was already there, the new one pulled"
    assert 4 * MB <= last.bytes_done == last.bytes_total < 5 * MB, last
    assert along, "a pull of about 2 s reports along the way"
    assert any(0 < report.bytes_done < report.bytes_total for report in along), along
    assert {report.began_at for report in reports} == {first.began_at}, "one pull"
    stamps = [report.seconds for report in reports[:-1]]
    assert all(later - earlier >= REPORT_SECONDS * 0.9 for earlier, later in pairwise(stamps))
    done = [report.bytes_done for report in reports]
    assert done == sorted(done), "progress never goes back"

    again: list[PullProgress] = []
    second = runtime.start(docker_spec(["true"], image=slow_image), on_pull=again.append)
    assert wait_for(lambda: runtime.poll(second).state == "exited")
    assert again == [], "an image already there is not pulled, and nothing is reported"


def test_a_pull_that_outlasts_the_start_budget_ends_with_the_start(
    registry: Registry, test_image: str, docker_spec: SpecFactory
) -> None:
    ref = push_unique_image(registry, test_image, payload_mb=4)
    link = SlowLink(registry.address, MB // 4)  # 16 s for the layer
    slow = ref.replace(registry.address, link.address)
    reports: list[PullProgress] = []
    began = time.monotonic()
    try:
        with pytest.raises(DriverTimeout):
            DockerRuntime(pull_images=True).start(docker_spec(["true"], image=slow), timeout=3, on_pull=reports.append)
        took = time.monotonic() - began
    finally:
        link.close()
        remove_image(slow)
    assert took < 6, f"the start gave up after {took:.1f} s on a budget of 3 s"
    assert reports and not any(report.done for report in reports)
    assert not _present(slow)


def test_an_image_the_registry_does_not_have_is_a_permanent_error(registry: Registry, docker_spec: SpecFactory) -> None:
    reports: list[PullProgress] = []
    missing = registry.ref("gpucloud-test/never-pushed")
    with pytest.raises(PermanentDriverError) as refused:
        DockerRuntime(pull_images=True).start(docker_spec(["true"], image=missing), on_pull=reports.append)
    assert refused.value.code == "image_not_found", refused.value
    assert [report.done for report in reports] == [False], "the pull began, and never finished"
