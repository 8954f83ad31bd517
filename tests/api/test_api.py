"""The Python API: load/translate/score/classify return what the CLI prints, fit trains as `multibranch train`,
user errors are UserError subclasses, and the public names stay."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import multibranch

SHORT = {"max_len_a": 0.0, "max_len_b": 8}  # as api_model decodes: at most 8 tokens, a fast test

# the public surface: a name removed from multibranch.__all__ breaks users' code
PUBLIC = ["AlignedTranslation", "AttentionMaps", "AverageResult", "CheckpointError", "CheckpointEvent", "ConfigError",
          "DataError", "Evaluation", "ExistingFileError", "ExperimentConfig", "ExportResult", "ForcedScore",
          "MissingFileError", "Model", "PruneResult", "ReportFolder", "TrainResult", "UnsupportedError", "UserError",
          "ValidationEvent", "WrongTaskError", "__version__", "analyze", "average", "build", "evaluate_translation",
          "export", "fit", "layers", "load", "prepare", "presets", "prune"]


def test_public_names_stay():
    assert sorted(multibranch.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(multibranch, name) is not None
    assert set(PUBLIC) <= set(dir(multibranch))


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        multibranch.nope  # noqa: B018


def test_import_stays_light():
    code = "import sys, multibranch; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_presets_are_the_cli_list():
    from multibranch.experiment import list_presets

    assert multibranch.presets() == list_presets() and "mat-tiny" in multibranch.presets()


def test_fit_result(api_run):
    assert api_run.step == 8
    assert api_run.last_checkpoint == api_run.run_dir / "last.pt" and api_run.last_checkpoint.is_file()
    assert api_run.best_checkpoint is not None and api_run.best_checkpoint.is_file()
    assert set(api_run.valid) >= {"loss"}


def test_model_properties(api_model, api_run):
    assert api_model.task == "translation"
    assert isinstance(api_model.config, multibranch.ExperimentConfig)
    assert api_model.config.train.max_steps == 8
    from tests.helpers.translation import translator_of

    model = translator_of(api_run.last_checkpoint).model
    assert api_model.parameters_count == sum(p.numel() for p in model.parameters())


def test_translate_matches_the_translator(api_model, api_run, test_lines):
    from tests.helpers.translation import translator_of

    translator = translator_of(api_run.last_checkpoint, beam=2, **SHORT)
    expected = translator.translate(test_lines)
    assert api_model.translate(test_lines, beam=2) == expected
    assert api_model.translate(test_lines[0], beam=2) == expected[0]
    assert api_model.translate("") == ""
    nbest = api_model.translate(test_lines, beam=3, nbest=2)
    assert [len(entries) for entries in nbest] == [2, 2, 2]
    assert nbest == [[text for text, _ in entries] for entries in translator_of(
        api_run.last_checkpoint, beam=3, **SHORT).translate_nbest(test_lines, 2)]
    assert api_model.decode.beam == api_model.config.decode.beam  # a per-call beam changes no later call


def test_score_is_forced_decoding(api_model, test_lines):
    scores = api_model.score(test_lines + [""], test_lines + ["x"])
    assert scores[-1] is None
    assert all(s.log_prob < 0 and s.tokens > 0 for s in scores[:-1])
    one = api_model.score(test_lines[0], test_lines[0])
    assert one == scores[0]


def test_ensemble_of_one_checkpoint_twice(api_run, api_model, test_lines):
    pair = multibranch.load([api_run.last_checkpoint, api_run.last_checkpoint], beam=2, **SHORT)
    assert pair.parameters_count == 2 * api_model.parameters_count
    assert pair.translate(test_lines) == api_model.translate(test_lines, beam=2)  # same members: same outputs


def test_int8_keeps_the_count_and_options_equal_to_the_config_reuse_the_decoder(api_run, api_model, test_lines):
    from multibranch.modules.packed_linear import int8_supported

    if not int8_supported():
        pytest.skip("this CPU's PyTorch has no int8 linear layers")
    int8 = multibranch.load(api_run.last_checkpoint, precision="int8", max_len_a=0.0, max_len_b=8)
    assert int8.parameters_count == api_model.parameters_count
    assert len(int8.translate(test_lines)) == 3
    assert api_model._with("translate", {"nbest": 1, "beam": api_model.decode.beam}) is api_model._translator


def test_sampling_with_seed_repeats(api_model, test_lines):
    first = api_model.translate(test_lines, nbest=2, sampling=True, seed=3)
    assert first == api_model.translate(test_lines, nbest=2, sampling=True, seed=3)
    assert [len(samples) for samples in first] == [2, 2, 2]
    assert isinstance(api_model.translate(test_lines[0], sampling=True, seed=3), str)  # nbest 1: the text itself


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda m, p: multibranch.load(p.parent / "missing.pt"), multibranch.CheckpointError, "checkpoint not found"),
    (lambda m, p: m.classify("x"), multibranch.WrongTaskError, "is a translation model, not a classifier"),
    (lambda m, p: m.labels, multibranch.WrongTaskError, "not a classifier"),
    (lambda m, p: m.translate("x", bem=3), multibranch.ConfigError, "unknown decoding option 'bem'"),
    (lambda m, p: m.translate("x", beam=2, nbest=3), multibranch.ConfigError, "nbest=3 must be between 1 and beam=2"),
    (lambda m, p: m.translate(3), multibranch.UserError, "give a str or a list of str"),
    (lambda m, p: multibranch.load(p, ensemble_mean="max"), multibranch.UserError, "choose 'prob' or 'log-prob'"),
    (lambda m, p: multibranch.load([]), multibranch.UserError, "give a checkpoint path"),
    (lambda m, p: multibranch.load(p, device="meta"), multibranch.ConfigError, "runs on cpu or cuda"),
    (lambda m, p: multibranch.load(p, device=torch.device("cuda", 7)), multibranch.ConfigError, "^device cuda:7: "),
    (lambda m, p: multibranch.fit("transformer-tiny", data=5, out=p.parent), multibranch.UserError,
     "fit: data must be a path"),
    (lambda m, p: multibranch.fit("transformer-tiny", data=p.parent, out=p.parent / "x", device=None),
     multibranch.UserError, "fit: device must be a str"),
    (lambda m, p: multibranch.fit("transformer-tiny", data=p.parent, out=p.parent / "x", on_validation=5),
     multibranch.UserError, "on_validation: give a function"),
    (lambda m, p: m.translate("x", alignment=True, alignment_layer="x"), multibranch.UserError,
     "alignment layer 'x': give an int"),
    (lambda m, p: m.attention("x").map("cross", layer="0"), multibranch.ConfigError, "layer must be an int, not str"),
    (lambda m, p: m.attention("x").map("cross", head=True), multibranch.ConfigError, "head must be an int, not bool"),
    (lambda m, p: multibranch.average(p.parent / "avg.pt", str(p)), multibranch.UserError,
     "average: checkpoints must be a list of checkpoint paths, not str"),
    (lambda m, p: multibranch.export(None, p.parent / "x"), multibranch.UserError, "export: give ckpt"),
    (lambda m, p: multibranch.prune(p, p.parent / "x.pt", heads="encoder.layers.0.self_attn"), multibranch.UserError,
     "prune: heads must be a list of"),
    (lambda m, p: multibranch.analyze("heads", 5, p.parent / "x", data=p.parent), multibranch.UserError,
     "analyze: ckpt must be a list of checkpoint paths, not int"),
    (lambda m, p: multibranch.evaluate_translation(None, ["a"]), multibranch.UserError,
     "hypotheses must be a list of str"),
    (lambda m, p: m.score("x", "y", nbest=2, sampling=True), multibranch.UserError,
     "score: nbest, sampling only shape a search or samples"),
])
def test_user_errors(api_model, api_run, call, error, message):
    with pytest.raises(error, match=message):
        call(api_model, api_run.last_checkpoint)


def test_fit_refuses_an_existing_run_and_unknown_keys(api_run, tiny_data, tmp_path):
    from tests.helpers.configs import tiny_experiment

    with pytest.raises(multibranch.ExistingFileError, match="resume=True .*force=True") as info:
        multibranch.fit(tiny_experiment(), data=tiny_data, out=api_run.run_dir, max_steps=8)
    assert isinstance(info.value, FileExistsError)
    with pytest.raises(multibranch.ConfigError, match="unknown override 'max_stepz'"):
        multibranch.fit(tiny_experiment(), data=tiny_data, out=tmp_path / "run", max_stepz=8)
    with pytest.raises(multibranch.ConfigError, match="max_stepz"):
        multibranch.fit(tiny_experiment(), data=tiny_data, out=tmp_path / "run", **{"train.max_stepz": 8})
    with pytest.raises(multibranch.ConfigError, match="unknown preset 'nosuch'"):
        multibranch.fit("nosuch", data=tiny_data, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_fit_auto_resume_starts_over_a_run_stopped_before_its_first_checkpoint(api_run, tiny_data, tmp_path):
    """As `train --auto-resume`, and the refusals name fit's arguments, not the CLI's flags."""
    import shutil

    from tests.helpers.configs import tiny_experiment

    out = tmp_path / "run"
    shutil.copytree(api_run.run_dir, out, ignore=shutil.ignore_patterns("*.pt"))  # the run before its checkpoints
    with pytest.raises(multibranch.ExistingFileError) as info:
        multibranch.fit(tiny_experiment(), data=tiny_data, out=out, device="cpu", max_steps=2)
    assert "pass auto_resume=True or force=True to start it over" in str(info.value)
    with pytest.raises(multibranch.UserError) as info:
        multibranch.fit(tiny_experiment(), data=tiny_data, out=out, auto_resume=True, force=True)
    assert str(info.value) == ("auto_resume=True decides by itself whether to resume; leave out resume=True and "
                               "force=True")
    result = multibranch.fit(tiny_experiment(), data=tiny_data, out=out, device="cpu", max_steps=2, valid_every=2,
                             auto_resume=True)
    assert result.step == 2 and result.last_checkpoint is not None
    assert multibranch.fit(tiny_experiment(), data=tiny_data, out=out, device="cpu", max_steps=4, valid_every=2,
                           auto_resume=True).step == 4  # now a resume


def test_fit_gives_the_caller_its_thread_count_and_determinism_back(tiny_data, tmp_path):
    from tests.helpers.configs import tiny_experiment

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(False)
    try:
        multibranch.fit(tiny_experiment(), data=tiny_data, out=tmp_path / "run", device="cpu", max_steps=1,
                        valid_every=1, threads=1, **{"train.deterministic": True})
        assert torch.get_num_threads() == 2 and not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def test_fit_resumes_exactly(tiny_data, tmp_path, api_run):
    """Paused at update 4 and resumed to 8: the weights of the straight 8-update run."""
    from tests.helpers.configs import tiny_experiment

    out = tmp_path / "run"
    paused = multibranch.fit(tiny_experiment(), data=tiny_data, out=out, device="cpu", max_steps=8, valid_every=4,
                             stop_at_step=4)
    assert paused.step == 4
    resumed = multibranch.fit(None, data=tiny_data, out=out, device="cpu", resume=True)
    assert resumed.step == 8
    a = torch.load(resumed.last_checkpoint, weights_only=True)["model"]
    b = torch.load(api_run.last_checkpoint, weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_classify_as_the_cli(api_classifier):
    from multibranch.loading.model import LoadedModel
    from multibranch.tasks.classification.inference import classify_text_lines
    from tests.helpers.classification import TEXTS

    model = multibranch.load(api_classifier)
    assert model.task == "classification" and model.labels == ["colour", "number", "place"]
    cli_model = LoadedModel.load(str(api_classifier), "cpu", tasks=("classification",))  # what `classify` loads
    labels, probs = cli_model.labels, classify_text_lines(cli_model, TEXTS + [""])
    expected = [None if p is None else labels[max(range(len(p)), key=p.__getitem__)] for p in probs]
    assert model.classify(TEXTS + [""]) == expected
    assert model.classify(TEXTS[0]) == expected[0]
    with_probs = model.classify(TEXTS, probs=True)
    flat = [p for d in with_probs for p in d.values()]
    assert flat == pytest.approx([p for row in probs[:-1] for p in row])
    assert all(list(d) == labels for d in with_probs)
    pair = multibranch.load([api_classifier, api_classifier])  # an ensemble: the mean of equal members
    assert [p for d in pair.classify(TEXTS, probs=True) for p in d.values()] == pytest.approx(flat)
    with pytest.raises(multibranch.WrongTaskError, match="is a classification model, not a translation model"):
        model.translate("red")
    with pytest.raises(multibranch.WrongTaskError, match="not a translation model"):
        model.score("red", "x")
    with pytest.raises(multibranch.DataError, match="classifies single texts, not sentence pairs"):
        model.classify([("red", "seven")])
    with pytest.raises(multibranch.UserError, match="decodes nothing"):
        multibranch.load(api_classifier, beam=3)


def test_export_and_ctranslate2_directories(api_run, api_model, test_lines, tmp_path):
    pytest.importorskip("ctranslate2")
    from multibranch.checkpoint.export import export
    from multibranch.checkpoint.format import load_checkpoint
    from multibranch.convert.ct2 import export_ct2
    from multibranch.tasks.translation.ct2 import Ct2Translator

    payload = load_checkpoint(api_run.last_checkpoint)
    export(payload, tmp_path / "export")
    exported = multibranch.load(tmp_path / "export", max_len_a=0.0, max_len_b=8)
    assert exported.translate(test_lines) == api_model.translate(test_lines)
    ct2 = multibranch.load(export_ct2(payload, tmp_path / "ct2"), max_len_a=0.0, max_len_b=8)
    assert ct2.task == "translation" and ct2.config is None and ct2.parameters_count is None
    direct = Ct2Translator(tmp_path / "ct2", beam=2, **SHORT)  # what `translate --ckpt DIR` decodes with
    assert ct2.translate(test_lines, beam=2) == direct.translate(test_lines)
    assert ct2.translate(test_lines[0], beam=2, nbest=2) == [text for text, _ in direct.translate_nbest(test_lines, 2)[0]]
    assert ct2.score(test_lines[0], test_lines[1]).log_prob == pytest.approx(
        api_model.score(test_lines[0], test_lines[1]).log_prob, abs=1e-3)
    with pytest.raises(multibranch.UserError, match="CTranslate2 directory, which cannot be an ensemble member"):
        multibranch.load([tmp_path / "ct2", api_run.last_checkpoint])
    with pytest.raises(multibranch.UserError, match="decodes with the quantization it was converted with"):
        multibranch.load(tmp_path / "ct2", precision="int8")


def test_prepare_as_the_command(tiny_data, tmp_path):
    import json

    raw = tiny_data.parent / "raw"
    meta = multibranch.prepare(raw / "train", tmp_path / "data", src="src", tgt="tgt", valid=raw / "valid",
                               test=[raw / "test"], vocab_size=200)
    expected = json.loads((tiny_data / "data.json").read_text(encoding="utf-8"))  # made by the library directly
    assert meta["splits"] == expected["splits"] and meta["vocab_size"] == expected["vocab_size"]
    with pytest.raises(multibranch.DataError, match="exists and is not empty; pass force=True to replace it"):
        multibranch.prepare(raw / "train", tmp_path / "data", src="src", tgt="tgt", valid=raw / "valid")
    with pytest.raises(multibranch.ConfigError, match="unknown option 'vocab'"):
        multibranch.prepare(raw / "train", tmp_path / "other", vocab=200)
    with pytest.raises(multibranch.ConfigError, match="invalid choice: 'spell'"):
        multibranch.prepare(raw / "train", tmp_path / "other", task="spell")
    with pytest.raises(multibranch.UserError, match="required: --src, --tgt, --valid"):
        multibranch.prepare(raw / "train", tmp_path / "other")


def test_a_sentence_pair_classifier_prepared_trained_and_used_through_the_api(tmp_path):
    from multibranch.loading.model import LoadedModel
    from multibranch.tasks.classification.inference import classify_text_lines
    from tests.helpers.classification import classifier_experiment, synthetic_lines

    rows = [line.rstrip("\n").split("\t") for line in synthetic_lines(90, seed=4)]
    (tmp_path / "pairs.tsv").write_text("".join(f"{label}\t{text}\tand {text}\n" for label, text in rows),
                                        encoding="utf-8")
    meta = multibranch.prepare(tmp_path / "pairs.tsv", tmp_path / "data", task="classification", holdout=0.2,
                               text_column=["1", "2"], header="no", vocab_size=60)
    assert meta["labels"] == ["colour", "number", "place"]
    run = multibranch.fit(classifier_experiment(), data=tmp_path / "data", out=tmp_path / "run", max_steps=2,
                          valid_every=2, device="cpu")
    model = multibranch.load(run.last_checkpoint)
    examples = [("red of it", "and red of it"), ("seven a", "and seven a")]
    probs = classify_text_lines(LoadedModel.load(str(run.last_checkpoint), "cpu"), [f"{a}\t{b}" for a, b in examples])
    got = model.classify(examples, probs=True)
    assert [p for d in got for p in d.values()] == pytest.approx([p for row in probs for p in row])
    assert model.classify(examples[0]) == model.classify([list(examples[0])])[0]  # one pair; a pair as a list
    with pytest.raises(multibranch.DataError, match="classifies sentence pairs"):
        model.classify("red of it")


def test_evaluate_translation_takes_one_metric_by_its_name():
    lines = ["a small house stands by the river", "two dogs run across the green field"]
    one = multibranch.evaluate_translation(lines, lines, metrics="bleu")
    assert one.scores == multibranch.evaluate_translation(lines, lines, metrics=["bleu"]).scores
    assert list(one.scores) == ["bleu"] and one.scores["bleu"] == pytest.approx(100.0)
