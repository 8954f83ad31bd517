"""docs/architecture.md's worked examples (adding a task, adding a layer kind) run as written there.

Each example runs in its own interpreter: a registered task or layer kind must not leak into the other
tests (the layer contract suite covers every registered kind).
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def example(name: str) -> str:
    """The code block after `<!-- example: NAME -->` in docs/architecture.md."""
    match = re.search(rf"<!-- example: {re.escape(name)} -->\n```python\n(.*?)```", DOC.read_text(), re.S)
    assert match, f"docs/architecture.md has no example {name!r}"
    return match.group(1)


def run_python(code: str, tmp_path: Path) -> str:
    script = tmp_path / "example.py"
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_task_example_plugs_in_with_its_folder_and_one_registry_line(tmp_path):
    # the registry line, as documented, replaces TASKS in the registry module
    registry_line = example("task-registry").strip()
    code = example("task") + textwrap.dedent(f"""
        import json
        from pathlib import Path

        import multibranch.tasks.registry as registry
        from multibranch.tasks.classification.task import ClassificationTask
        from multibranch.tasks.code.task import CodeTask
        from multibranch.tasks.translation.task import TranslationTask
        from multibranch.data.parallel_prepare import PrepareConfig
        from multibranch.tasks.translation.prepare import prepare
        from multibranch.tasks.translation.synthetic import generate_synthetic_task
        from multibranch.config import from_dict
        from multibranch.experiment import ExperimentConfig
        from multibranch.tasks import task_name_of, train
        from multibranch.loading.checkpoint import load_model
        from multibranch.train.trainer import RunOptions

        {registry_line}
        registry.TASKS = TASKS

        root = Path("work")
        generate_synthetic_task(root / "raw", seed=3, n_train=120, n_valid=8, n_test=8)
        prepare(PrepareConfig(src_lang="src", tgt_lang="tgt", train=str(root / "raw" / "train"),
                              valid=str(root / "raw" / "valid"), test=[], out=str(root / "data"), vocab_size=120))
        assert task_name_of(root / "data") == "translation"  # unmarked data stays translation
        meta_file = root / "data" / "data.json"
        meta = json.loads(meta_file.read_text())
        meta["task"] = "reverse"
        meta_file.write_text(json.dumps(meta))
        assert task_name_of(root / "data") == "reverse"

        cfg = from_dict(ExperimentConfig, {{
            "model": {{"d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 1}},
            "train": {{"max_tokens": 400, "max_steps": 2, "valid_every": 2, "valid_bleu": False, "log_every": 1}}}})
        train(cfg, RunOptions(data_dir=root / "data", run_dir=root / "run", progress=False))
        loaded = load_model(root / "run" / "last.pt")
        print("task", loaded.config.task, type(loaded.model).__name__)
    """)
    assert run_python(code, tmp_path).split() == ["task", "reverse", "Seq2SeqModel"]


def test_the_layer_kind_example_registers_validates_and_equals_its_mat_twin(tmp_path):
    code = example("layer-kind") + textwrap.dedent("""
        import torch

        from multibranch.config import from_dict
        from multibranch.errors import ConfigError
        from multibranch.models import ModelConfig, build_model

        base = {"d_model": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 2, "decoder_layers": 1,
                "src_vocab_size": 30, "tgt_vocab_size": 30, "dropout": 0.0}
        wide = build_model(from_dict(ModelConfig, {**base, "encoder": {"kind": "wide-ffn"}})).eval()
        twin = build_model(from_dict(ModelConfig, {**base, "encoder": {"kind": "transformer", "ffn_branches": 2}})).eval()
        twin.load_state_dict(wide.state_dict())  # same parameters, same names
        src = torch.randint(4, 30, (3, 7))
        prev = torch.randint(4, 30, (3, 5))
        assert torch.equal(wide(src, prev), twin(src, prev))
        try:
            from_dict(ModelConfig, {**base, "encoder": {"kind": "wide-ffn", "ffn_branches": 1}}).validate()
        except ConfigError as error:
            print("refused:", error)
    """)
    out = run_python(code, tmp_path)
    assert "refused: encoder: wide-ffn needs ffn_branches >= 2, got 1" in out


@pytest.mark.parametrize("name", ["task", "task-registry", "layer-kind"])
def test_every_example_is_in_the_doc(name):
    assert example(name).strip()
