"""ops/k8s: every document of every manifest is valid against the Kubernetes OpenAPI
schemas, offline (issue 37).

kubernetes-validate (the dev extra) ships the schemas of each Kubernetes release,
so no cluster and no network is needed: the tests refuse every connection to
prove it. Strict: a field the schema does not know (a misspelling, a field put at
the wrong level) is an error, as `kubectl apply --validate=strict` would make it.
Each manifest is checked against two releases: the oldest the manifests say they
run on unchanged (``backoffLimitPerIndex``: Kubernetes >= 1.29, training.yaml and
init-container-wait.yaml) and a recent one.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.conftest import ROOT

K8S = Path(ROOT) / "ops" / "k8s"
VERSIONS = ("1.29", "1.37")
"""The oldest Kubernetes the manifests support as they are, and a recent release
(the dev extra asks for a kubernetes-validate that ships its schemas)."""
INIT_WAIT = K8S / "init-container-wait.yaml"


def documents(path: Path) -> list[dict[str, Any]]:
    """The documents of a (possibly multi-document) YAML file, empty ones left out."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


MANIFESTS = sorted(K8S.glob("*.yaml"))
DOCUMENTS = [
    pytest.param(path, index, id=f"{path.name}#{index}:{doc['kind']}/{doc['metadata']['name']}")
    for path in MANIFESTS
    for index, doc in enumerate(documents(path))
]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No connection may be made: the schemas must come from the package."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a network connection was attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    yield


def test_every_manifest_is_found_and_has_documents() -> None:
    assert {path.name for path in MANIFESTS} >= {
        "init-container-wait.yaml", "redis.yaml", "training.yaml", "exporter.yaml",
        "networkpolicy.yaml", "ps.yaml", "settings.yaml",
    }  # fmt: skip
    assert all(documents(path) for path in MANIFESTS)
    assert len(documents(K8S / "redis.yaml")) > 1  # multi-document files are split


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("path", "index"), DOCUMENTS)
def test_each_document_is_valid_against_the_kubernetes_schema(
    path: Path, index: int, version: str
) -> None:
    doc = documents(path)[index]
    try:
        validated = kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"{path.name}, {doc['kind']}/{doc['metadata']['name']}: {error}")
    assert validated == version  # the schemas of that very release, not an older one


def broken(original: str, replacement: str) -> dict[str, Any]:
    """init-container-wait.yaml's Job with ``original`` replaced (once)."""
    text = INIT_WAIT.read_text()
    assert text.count(original) == 1, original
    [job] = [doc for doc in yaml.safe_load_all(text.replace(original, replacement)) if doc]
    return job


@pytest.mark.parametrize(
    ("original", "replacement", "told"),
    [
        # a misspelled field: deep in the pod template, in the Job's spec
        ("restartPolicy: Never", "restartPolicyy: Never", "'restartPolicyy' was unexpected"),
        ("completionMode: Indexed", "completionMod: Indexed", "'completionMod' was unexpected"),
        ("initContainers:", "initContainer:", "'initContainer' was unexpected"),
        # a field at the wrong level: the pod spec's, put in the Job's spec
        (
            "completionMode: Indexed",
            "restartPolicy: Never\n  completionMode: Indexed",
            "'restartPolicy' was unexpected",
        ),
        # a wrong type
        ("completions: 3", "completions: three", "'three' is not of type 'integer'"),
    ],
)
def test_a_broken_copy_of_the_init_container_manifest_fails(
    original: str, replacement: str, told: str
) -> None:
    job = broken(original, replacement)
    for version in VERSIONS:
        with pytest.raises(kubernetes_validate.ValidationError) as raised:
            kubernetes_validate.validate(job, version, strict=True)
        assert told in str(raised.value), raised.value


def test_an_unbroken_copy_of_the_init_container_manifest_passes() -> None:
    """The breakages above are the only reason their copies fail."""
    job = broken("restartPolicy: Never", "restartPolicy: Never")
    for version in VERSIONS:
        assert kubernetes_validate.validate(job, version, strict=True) == version
