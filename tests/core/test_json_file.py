"""read_json_object: one error line naming the file for every way a JSON object file can be bad."""

from __future__ import annotations

import pytest

from multibranch.errors import DataError
from multibranch.json_file import read_json_object


@pytest.mark.parametrize(("content", "message"), [
    (b"{not json", "corrupted, not valid JSON"),
    (b"\xff\xfe{}", "corrupted, not valid JSON"),
    (b"[1, 2]", "corrupted, a JSON list instead of an object"),
    (b"", "corrupted, not valid JSON"),
])
def test_bad_documents_name_the_file_and_the_hint(content, message, tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(DataError) as caught:
        read_json_object(path, DataError, "run it again")
    text = str(caught.value)
    assert text.startswith(f"{path}: {message}") and text.endswith("; run it again") and "\n" not in text


def test_a_directory_cannot_be_read_and_an_object_is_returned(tmp_path):
    with pytest.raises(DataError, match="cannot be read"):
        read_json_object(tmp_path, DataError)
    (tmp_path / "ok.json").write_text('{"a": [1, "é"]}', encoding="utf-8")
    assert read_json_object(tmp_path / "ok.json", DataError) == {"a": [1, "é"]}
