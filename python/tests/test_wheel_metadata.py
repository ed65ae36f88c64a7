"""What the package index shows of the installed package: a description
written for users of the wheel (not the repository's developer guide, with
its ./scripts commands), and the licence."""

import importlib.metadata
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_description_is_the_wheel_readme_and_names_no_repository_script():
    metadata = importlib.metadata.metadata("shardkeep")
    description = metadata.get_payload()  # type: ignore[attr-defined]
    assert description.strip() == (REPO / "docs" / "WHEEL_README.md").read_text().strip()
    assert "./scripts" not in description and "pip install shardkeep" in description


def test_the_licence_is_in_the_metadata_and_beside_the_code():
    metadata = importlib.metadata.metadata("shardkeep")
    assert metadata["License"] == "Apache-2.0"
    assert "License :: OSI Approved :: Apache Software License" in metadata.get_all("Classifier")
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")
