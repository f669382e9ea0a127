"""The TrainJob and PyTorchJob manifests of docs/guides/clouds/kubernetes.md, checked without a
cluster: their structure against the resources' schemas (field names and types; a subset written
by hand from Kubeflow's Go API types of Trainer v2.0 and training-operator v1.8, not downloaded:
tests/fixtures/kubeflow/README.md), and their node and process counts against the recipe that
their fw command composes (the recipe's ``trainer.num_nodes`` and ``trainer.devices``).

A manifest with a misspelt field, or a field of the wrong type, fails the validation (tested
below), so the check can fail."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from framework.config import load_recipe
from tests.docsite.blocks import ROOT, blocks

PAGE = ROOT / "docs" / "guides" / "clouds" / "kubernetes.md"
SCHEMAS = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "kubeflow" / "schemas.json").read_text())


def manifest(path: str) -> dict:
    """The page's ``<!-- file: path -->`` block, parsed."""
    found = [block for block in blocks(PAGE) if block.file == path]
    assert len(found) == 1, f"{PAGE.name} should show one {path}"
    assert found[0].language == "yaml"
    return yaml.safe_load(found[0].body)


def errors(document: dict) -> list[str]:
    """What the schema of the document's kind says is wrong with it (nothing: valid)."""
    schema = {**SCHEMAS, "$ref": f"#/$defs/{document.get('kind')}"}
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def fw_command(container: dict) -> list[str]:
    command = [*container.get("command", []), *container.get("args", [])]
    assert command[:2] == ["fw", "fit"], command
    return command[2:]


def composed(command: list[str]) -> dict:
    """The recipe that ``fw fit RECIPE OVERRIDES...`` runs (composed as the CLI does, nothing trained)."""
    recipe, *overrides = command
    return load_recipe(ROOT / recipe, overrides)[0]


@pytest.mark.parametrize("path", ["k8s/trainjob.yaml", "k8s/pytorchjob.yaml"])
def test_the_manifests_follow_the_schemas(path):
    document = manifest(path)
    assert errors(document) == []


def test_the_trainjob_asks_for_what_its_recipe_runs():
    trainer = manifest("k8s/trainjob.yaml")["spec"]["trainer"]
    recipe = composed(fw_command(trainer))
    assert recipe["trainer"]["num_nodes"] == trainer["numNodes"]
    assert recipe["trainer"]["devices"] == trainer["numProcPerNode"]
    assert recipe["trainer"]["default_root_dir"].startswith("s3://") and recipe["ckpt_path"] == "last"


def test_the_pytorchjob_asks_for_what_its_recipe_runs():
    replicas = manifest("k8s/pytorchjob.yaml")["spec"]["pytorchReplicaSpecs"]
    containers = [spec["template"]["spec"]["containers"][0] for spec in replicas.values()]
    assert all(c["name"] == "pytorch" for c in containers)  # the operator's default container name
    assert all(spec["restartPolicy"] == "OnFailure" for spec in replicas.values())
    recipes = [composed(fw_command(c)) for c in containers]
    assert recipes[0] == recipes[1]  # every pod runs the same job
    assert recipes[0]["trainer"]["num_nodes"] == sum(spec["replicas"] for spec in replicas.values())
    assert recipes[0]["ckpt_path"] == "last"


@pytest.mark.parametrize(("path", "where", "change", "words"), [
    ("k8s/trainjob.yaml", ["spec", "trainer"], lambda t: t.update(numNode=t.pop("numNodes")),
     "'numNode' was unexpected"),
    ("k8s/trainjob.yaml", ["spec", "trainer"], lambda t: t.update(numNodes="2"), "'2' is not of type 'integer'"),
    ("k8s/trainjob.yaml", ["spec", "runtimeRef"], lambda r: r.pop("name"), "'name' is a required property"),
    ("k8s/pytorchjob.yaml", ["spec", "pytorchReplicaSpecs"], lambda r: r.update(Workers=r.pop("Worker")),
     "'Workers' was unexpected"),
    ("k8s/pytorchjob.yaml", ["spec", "pytorchReplicaSpecs", "Master"], lambda m: m.update(restartPolicy="Sometimes"),
     "'Sometimes' is not one of"),
    ("k8s/pytorchjob.yaml", ["spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers", 0],
     lambda c: c.update(enviroment=c.pop("env")), "'enviroment' was unexpected"),
])
def test_a_misspelt_or_mistyped_field_fails_validation(path, where, change, words):
    document = copy.deepcopy(manifest(path))
    node = document
    for key in where:
        node = node[key]
    change(node)
    found = errors(document)
    assert any(words in line for line in found), found
