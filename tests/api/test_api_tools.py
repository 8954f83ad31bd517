"""evaluate_translation, average, export and prune from Python: typed results, checked against what they promise
(sacreBLEU's own numbers, the mean of the weights, the same translations, the heads gone)."""

from __future__ import annotations

import pytest
import torch

import multibranch


def test_evaluate_translation_gives_sacrebleus_scores_and_signatures():
    import sacrebleu

    hyps = ["the cat sat on the mat", "a dog runs in the park", "it rains"]
    refs = ["the cat sat on a mat", "a dog runs in the park", "it is raining"]
    result = multibranch.evaluate_translation(hyps, refs, sentence_level=True)
    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    chrf = sacrebleu.corpus_chrf(hyps, [refs])
    assert result.scores["bleu"] == pytest.approx(bleu.score) and result.scores["chrf"] == pytest.approx(chrf.score)
    assert result.signatures["bleu"].startswith("nrefs:1|") and "tok:13a" in result.signatures["bleu"]
    assert result.sentences is not None and len(result.sentences["bleu"]) == 3 and result.comparison is None
    compared = multibranch.evaluate_translation(hyps, {"r": refs}, compare=refs, bootstrap_samples=50)
    assert compared.comparison is not None and compared.comparison["system"] == "compare"
    with pytest.raises(multibranch.DataError, match="line counts differ"):
        multibranch.evaluate_translation(hyps, refs[:2])
    with pytest.raises(multibranch.UserError, match="hypotheses must be a list of str"):
        multibranch.evaluate_translation("the cat", refs)


def test_average_is_the_mean_of_the_weights(api_run, tmp_path):
    steps = sorted((api_run.run_dir / "checkpoints").glob("step_*.pt"))
    assert len(steps) == 2
    result = multibranch.average(tmp_path / "avg.pt", steps)
    assert result.path == tmp_path / "avg.pt" and result.sources == steps
    a, b = (torch.load(p, weights_only=True)["model"] for p in steps)
    mean = torch.load(result.path, weights_only=True)["model"]
    name = next(k for k, v in mean.items() if v.is_floating_point())
    assert torch.allclose(mean[name], (a[name].double() + b[name].double()).div(2).to(mean[name].dtype))
    by_run = multibranch.average(tmp_path / "last2.pt", run=api_run.run_dir, last=2)
    assert by_run.sources == steps
    with pytest.raises(multibranch.ExistingFileError, match="force=True"):
        multibranch.average(tmp_path / "avg.pt", steps)
    with pytest.raises(multibranch.UserError, match="last"):
        multibranch.average(tmp_path / "x.pt", run=api_run.run_dir)


def test_export_then_load_translates_the_same(api_run, api_model, test_lines, tmp_path):
    result = multibranch.export(api_run.last_checkpoint, tmp_path / "release")
    assert result.directory == tmp_path / "release"
    assert "model.safetensors" in {p.name for p in result.files} and all(p.is_file() for p in result.files)
    exported = multibranch.load(result.directory, max_len_a=0.0, max_len_b=8)
    assert exported.translate(test_lines) == api_model.translate(test_lines)
    with pytest.raises(multibranch.UserError, match="kind 'onnx'"):
        multibranch.export(api_run.last_checkpoint, tmp_path / "other", kind="onnx")
    with pytest.raises(multibranch.UserError, match="force=True"):
        multibranch.export(api_run.last_checkpoint, tmp_path / "release")


def test_prune_removes_the_listed_heads(api_run, tmp_path):
    from multibranch.analysis.heads import attention_sites

    model = multibranch.load(api_run.last_checkpoint).module
    site = attention_sites(model)[0]
    result = multibranch.prune(api_run.last_checkpoint, tmp_path / "pruned.pt", heads=[(site.name, 0)], speed=False)
    assert result.checkpoint.is_file() and result.report_path == tmp_path / "pruned.json"
    assert result.removed == [(site.name, 0)]
    assert result.report["parameters"]["after"] < result.report["parameters"]["before"]
    pruned = multibranch.load(result.checkpoint).module
    assert sum(p.numel() for p in pruned.parameters()) == result.report["parameters"]["after"]
    with pytest.raises(multibranch.UserError, match="fraction 1.5"):
        multibranch.prune(api_run.last_checkpoint, tmp_path / "p2.pt", fraction=1.5, data=tmp_path)
    with pytest.raises(multibranch.UserError, match="unknown option 'speeed'"):
        multibranch.prune(api_run.last_checkpoint, tmp_path / "p3.pt", heads=[(site.name, 0)], speeed=False)


def test_analyze_heads_reports_every_attention_head(api_run, tiny_data, tmp_path):
    import json

    from multibranch.analysis.heads import attention_sites

    folder = multibranch.analyze("heads", api_run.last_checkpoint, tmp_path / "heads", data=tiny_data,
                                 max_examples=8, curve=False, dominant=False, progress=False)
    assert folder.path == tmp_path / "heads" and "index.md" in folder.files
    reports = [json.loads((folder.path / name).read_text()) for name in folder.files if name.endswith(".json")]
    text = json.dumps(reports)
    sites = attention_sites(multibranch.load(api_run.last_checkpoint).module)
    assert sites and all(site.name in text for site in sites)
    with pytest.raises(multibranch.UserError, match="step 2.0 must be in"):
        multibranch.analyze("heads", api_run.last_checkpoint, tmp_path / "h2", data=tiny_data, step=2.0)
    with pytest.raises(multibranch.UserError, match="no kernel gates|gates"):
        multibranch.analyze("gates", api_run.last_checkpoint, tmp_path / "gates")
    with pytest.raises(multibranch.UserError, match="kind 'entropy'"):
        multibranch.analyze("entropy", api_run.last_checkpoint, tmp_path / "e", data=tiny_data)
