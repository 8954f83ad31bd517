"""data.json of a prepared directory: one reader for translation and classification data."""

from __future__ import annotations

import json

import pytest

from multibranch.errors import DataError
from multibranch.tasks.classification.dataset import ClassificationData
from multibranch.tasks.translation.dataset import PreparedData


@pytest.mark.parametrize("loader", [PreparedData.load, ClassificationData.load])
@pytest.mark.parametrize("document", ["[]", '"text"', "3"])
def test_data_json_that_is_not_an_object_is_a_data_error(tmp_path, loader, document):
    (tmp_path / "data.json").write_text(document)
    with pytest.raises(DataError, match=r"data\.json: corrupted, a JSON \w+ instead of an object; run `multibranch prepare`"):
        loader(tmp_path)


@pytest.mark.parametrize(("loader", "key"), [(PreparedData.load, "fingerprint"), (ClassificationData.load, "labels")])
def test_missing_key_is_named(tmp_path, loader, key):
    good = {"format": "x", "format_version": 0}
    from multibranch.data import parallel_prepare as prepare
    from multibranch.tasks.classification import prepare as prepare_classify

    module = prepare if loader == PreparedData.load else prepare_classify
    good.update(format=module.FORMAT, format_version=module.FORMAT_VERSION, spm={}, splits={},
                fingerprint="f", vocab_size=8, labels=["a", "b"])
    del good[key]
    (tmp_path / "data.json").write_text(json.dumps(good))
    with pytest.raises(DataError, match=f"corrupted \\(missing '{key}'\\)"):
        loader(tmp_path)
