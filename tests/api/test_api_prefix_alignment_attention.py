"""`Model.translate(prefixes=..., alignment=True)` and `Model.attention`: the translations and alignments of
`multibranch translate --prefix / --print-alignment` (the CLI run in-process on the same checkpoint), the
Translator's prefixed n-best, and the maps of serve's POST /attention (`TorchEngine.attention`, what the
endpoint calls); the same refusals as the CLI and serve, as UserError subclasses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import multibranch
from multibranch.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SHORT = ["--max-len-a", "0", "--max-len-b", "8"]  # as api_model decodes


def cli_translate(ckpt: Path, tmp_path: Path, lines: list[str], *args: str, prefixes: list[str] | None = None
                  ) -> list[str]:
    """The output lines of `multibranch translate` of `lines` (with a --prefix file of `prefixes`)."""
    source = tmp_path / "src.txt"
    source.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    extra: list[str] = []
    if prefixes is not None:
        (tmp_path / "prefix.txt").write_text("".join(f"{p}\n" for p in prefixes), encoding="utf-8")
        extra = ["--prefix", str(tmp_path / "prefix.txt")]
    out = tmp_path / "out.txt"
    assert main(["translate", "--ckpt", str(ckpt), "--device", "cpu", "--no-progress", "-i", str(source), "-o",
                 str(out), "--force", *SHORT, *extra, *args]) == 0
    return out.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def prefixes(api_model, test_lines) -> list[str]:
    """Per test line: the first word of its translation's second-best, nothing, and one word."""
    second = api_model.translate(test_lines[0], beam=3, nbest=2)[1]
    return [second.split()[0] if second.split() else "x", "", "ka"]


# ---- prefixes ------------------------------------------------------------------------------------------


def test_prefixes_translate_as_the_cli_and_the_translator(api_model, api_run, test_lines, prefixes, tmp_path):
    from tests.helpers.translation import translator_of

    got = api_model.translate(test_lines + [""], beam=3, prefixes=prefixes + ["ka"])
    assert got == cli_translate(api_run.last_checkpoint, tmp_path, test_lines + [""], "--beam", "3",
                                prefixes=prefixes + ["ka"])
    translator = translator_of(api_run.last_checkpoint, beam=3, max_len_a=0.0, max_len_b=8)
    assert got[:3] == translator.translate(test_lines, prefixes=prefixes)
    assert got[0].startswith(prefixes[0]) and got[3] == ""
    assert got[1] == api_model.translate(test_lines[1], beam=3)  # "": no prefix
    assert api_model.translate(test_lines, beam=3, prefixes=[prefixes[0], None, prefixes[2]]) == got[:3]
    assert api_model.translate(test_lines[0], beam=3, prefixes=prefixes[0]) == got[0]  # one text, one str
    assert api_model.translate(test_lines[0], beam=3, prefixes=[prefixes[0]]) == got[0]
    nbest = api_model.translate(test_lines, beam=3, nbest=2, prefixes=prefixes)
    assert nbest == [[text for text, _ in entries] for entries in translator.translate_nbest(test_lines, 2, prefixes=prefixes)]


def test_prefixes_with_sampling_and_an_ensemble(api_model, api_run, test_lines, prefixes):
    samples = api_model.translate(test_lines, nbest=2, sampling=True, seed=5, prefixes=prefixes)
    assert samples == api_model.translate(test_lines, nbest=2, sampling=True, seed=5, prefixes=prefixes)
    assert all(text.startswith(prefixes[0]) for text in samples[0])
    pair = multibranch.load([api_run.last_checkpoint] * 2, beam=2, max_len_a=0.0, max_len_b=8)
    assert pair.translate(test_lines, prefixes=prefixes) == api_model.translate(test_lines, beam=2, prefixes=prefixes)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda m, lines: m.translate(lines, prefixes=["a"]), multibranch.DataError,
     "line counts differ: 3 input lines but 1 prefixes"),
    (lambda m, lines: m.translate(lines, prefixes=["ka lo mi ne su ta ri po ve da"] * 3), multibranch.DataError,
     r"prefix line 1 has \d+ tokens but its translation may have at most 8 \(max_len_a/max_len_b, the model's"),
    (lambda m, lines: m.translate(lines, prefixes="a"), multibranch.UserError, "give a list of one prefix per text"),
    (lambda m, lines: m.translate(lines, prefixes=[1, 2, 3]), multibranch.UserError, "one str \\(or None\\) per text"),
    (lambda m, lines: m.translate(lines, alignment_layer=0), multibranch.UserError,
     "alignment_layer chooses the layer of alignment=True; add alignment=True"),
    (lambda m, lines: m.translate(lines, alignment=True, alignment_layer=5), multibranch.UserError,
     r"alignment_layer: alignment layer 5: the decoder has layers 0..1"),
    (lambda m, lines: m.attention(""), multibranch.DataError, "attention: the text is empty"),
    (lambda m, lines: m.attention(lines), multibranch.UserError, "give one text"),
    (lambda m, lines: m.attention(lines[0]).map("cross", layer=2, head=0), multibranch.ConfigError,
     r"layer=2: the cross attention has layers 0..1"),
    (lambda m, lines: m.attention(lines[0]).map("cross", head=4), multibranch.ConfigError,
     r"head=4: layer 1 of the cross attention has heads 0..3"),
    (lambda m, lines: m.attention(lines[0]).map("cross", branch=1), multibranch.ConfigError, "branches 0..0"),
    (lambda m, lines: m.attention(lines[0]).map("cross", head=0, branch=0), multibranch.ConfigError,
     "at most one of head or branch"),
    (lambda m, lines: m.attention(lines[0]).map("cros"), multibranch.ConfigError,
     "kind='cros': this model has encoder_self, decoder_self, cross"),
])
def test_user_errors_are_the_clis(api_model, test_lines, call, error, message):
    with pytest.raises(error, match=message) as info:
        call(api_model, test_lines)
    assert "\n" not in str(info.value)


def test_the_cli_refuses_the_same_prefix(api_run, test_lines, tmp_path, capsys):
    """The API's message is the CLI's, with the API's argument names."""
    (tmp_path / "src.txt").write_text("".join(f"{line}\n" for line in test_lines), encoding="utf-8")
    (tmp_path / "prefix.txt").write_text("ka lo mi ne su ta ri po ve da\n" * 3, encoding="utf-8")
    assert main(["translate", "--ckpt", str(api_run.last_checkpoint), "--device", "cpu", "-i", str(tmp_path / "src.txt"),
                 "--prefix", str(tmp_path / "prefix.txt"), *SHORT]) == 2
    cli = capsys.readouterr().err.strip()
    with pytest.raises(multibranch.DataError) as info:
        multibranch.load(api_run.last_checkpoint, max_len_a=0.0, max_len_b=8).translate(
            test_lines, prefixes=["ka lo mi ne su ta ri po ve da"] * 3)
    assert cli.endswith(str(info.value).replace("max_len_a/max_len_b", "--max-len-a/--max-len-b"))


# ---- alignment -----------------------------------------------------------------------------------------


def test_alignment_is_the_clis_print_alignment(api_model, api_run, test_lines, prefixes, tmp_path):
    lines = test_lines + [""]
    got = api_model.translate(lines, beam=3, alignment=True)
    assert all(isinstance(t, multibranch.AlignedTranslation) for t in got)
    cli = cli_translate(api_run.last_checkpoint, tmp_path, lines, "--beam", "3", "--print-alignment")
    assert [f"{t.text} ||| {t.pharaoh}" for t in got] == cli
    assert [t.text for t in got] == api_model.translate(lines, beam=3)  # alignment=False: plain strings
    assert got[-1] == multibranch.AlignedTranslation("", [], 0.0)
    for t in got[:-1]:
        assert [j for _, j in t.alignment] == list(range(len(t.alignment)))
    layer0 = api_model.translate(lines, beam=3, alignment=True, alignment_layer=0)
    assert [f"{t.text} ||| {t.pharaoh}" for t in layer0] == cli_translate(
        api_run.last_checkpoint, tmp_path, lines, "--beam", "3", "--print-alignment", "--alignment-layer", "0")
    single = api_model.translate(test_lines[0], beam=3, alignment=True)
    assert single == got[0]


def test_alignment_with_nbest_and_prefixes_is_the_clis(api_model, api_run, test_lines, prefixes, tmp_path):
    got = api_model.translate(test_lines, beam=3, nbest=2, alignment=True, prefixes=prefixes)
    cli = cli_translate(api_run.last_checkpoint, tmp_path, test_lines, "--beam", "3", "--nbest", "2",
                        "--print-alignment", prefixes=prefixes)
    assert [f"{i} ||| {t.text} ||| {t.score:.6f} ||| {t.pharaoh}" for i, entries in enumerate(got) for t in entries] == cli
    assert got[0][0].text.startswith(prefixes[0])


def test_alignment_of_an_ensemble_of_one_model_twice(api_model, api_run, test_lines):
    pair = multibranch.load([api_run.last_checkpoint] * 2, beam=2, max_len_a=0.0, max_len_b=8)
    assert [t.alignment for t in pair.translate(test_lines, alignment=True)] == [
        t.alignment for t in api_model.translate(test_lines, beam=2, alignment=True)]


# ---- attention maps ------------------------------------------------------------------------------------


def test_attention_equals_serves_attention_endpoint(api_model, api_run, test_lines):
    """Every map equals what POST /attention answers (`TorchEngine.attention`) for that choice (up to float
    rounding: the endpoint probes one module, `attention` all of them in one forward, as `analyze attention`)."""
    from multibranch.serve.engine import load_torch_engine

    engine = load_torch_engine(str(api_run.last_checkpoint), "cpu", max_len_a=0.0, max_len_b=8)
    text = test_lines[0]
    maps = api_model.attention(text)
    assert maps.translation == api_model.translate(text)
    choices = engine.attention_choices()
    assert maps.kinds == list(choices)
    for kind, choice in choices.items():
        assert len(maps.heads[kind]) == choice["layers"]
        for layer in range(choice["layers"]):
            for head in range(choice["heads"][layer]):
                served = engine.attention(text, kind, layer, head=head)
                assert torch.allclose(maps.map(kind, layer, head=head), torch.tensor(served["weights"]), atol=1e-6)
                assert (maps.source_tokens, maps.target_tokens) == (served["source_tokens"], served["target_tokens"])
                assert list(maps.axes(kind)) == [served["rows"], served["columns"]]
                assert maps.modules[kind][layer] == served["module"] and served["translation"] == maps.translation
            for branch in range(choice["branches"][layer]):
                served = engine.attention(text, kind, layer, branch=branch)
                assert torch.allclose(maps.map(kind, layer, branch=branch), torch.tensor(served["weights"]),
                                      atol=1e-6)
    given = api_model.attention(text, translation=test_lines[1])
    served = engine.attention(text, "decoder_self", 1, head=2, target=test_lines[1])
    assert given.translation == test_lines[1] == served["translation"]
    assert torch.allclose(given.map("decoder_self", 1, head=2), torch.tensor(served["weights"]), atol=1e-6)


def test_attention_shapes_and_the_alignment_map(api_model, test_lines):
    text = test_lines[1]
    maps = api_model.attention(text)
    S, T = len(maps.source_tokens), len(maps.target_tokens)
    assert maps.source_tokens[-1] == "</s>" and maps.target_tokens[0] == "<s>"
    assert [m.shape for m in maps.heads["cross"]] == [(4, T, S)] * 2
    assert [m.shape for m in maps.heads["encoder_self"]] == [(4, S, S)] * 2
    assert [m.shape for m in maps.heads["decoder_self"]] == [(4, T, T)] * 2
    assert [m.shape for m in maps.branches["cross"]] == [(1, T, S)] * 2  # one branch: the mean of the 4 heads
    for kind in maps.kinds:
        for layer in (0, 1):
            assert torch.allclose(maps.map(kind, layer).sum(dim=-1), torch.ones(1), atol=1e-5)
    assert torch.equal(maps.map("cross", -1), maps.map("cross", 1))
    assert torch.allclose(maps.map("cross", 1), maps.map("cross", 1, branch=0))
    assert torch.allclose(maps.map("cross", 0), maps.heads["cross"][0].mean(dim=0))
    assert maps.target_tokens[1:] == api_model._translator.tokenizer.tgt.encode(maps.translation, out_type=str)


def test_attention_and_translation_refusals(api_run, api_classifier):
    pair = multibranch.load([api_run.last_checkpoint] * 2)
    with pytest.raises(multibranch.UnsupportedError, match="attention: maps are drawn from one model; this is an "
                                                           "ensemble of 2 .*: load one checkpoint"):
        pair.attention("ka")
    classifier = multibranch.load(api_classifier)
    with pytest.raises(multibranch.WrongTaskError, match="attention: .* is a classification model"):
        classifier.attention("red")
    with pytest.raises(multibranch.WrongTaskError, match="translate: .* is a classification model"):
        classifier.translate(["red"], prefixes=["a", "b"])
    with pytest.raises(multibranch.WrongTaskError, match="translate: .* is a classification model"):
        classifier.translate("red", alignment=True)


def test_a_ctranslate2_directory_refuses_prefixes_alignments_and_attention(monkeypatch, tmp_path):
    """The CLI's reasons (CT2_REFUSED); the directory is faked (no CTranslate2 needed to refuse)."""
    import multibranch.loading.model as loading
    from multibranch.experiment.decoding import DecodeConfig

    class FakeCt2:
        def __init__(self, *args, **kwargs):
            self.cfg, self.tokenizer = DecodeConfig(), None

        def translate(self, lines):
            return ["x" for _ in lines]

    monkeypatch.setattr(loading, "is_ct2_directory", lambda path: True)
    monkeypatch.setattr(loading, "Ct2Translator", FakeCt2)
    ct2 = multibranch.load(tmp_path)
    assert ct2.translate(["a", "b"]) == ["x", "x"]
    with pytest.raises(multibranch.UnsupportedError, match=r"prefixes: not with a CTranslate2 directory \(.*\): target "
                                                           "prefixes are not mapped"):
        ct2.translate("a", prefixes="b")
    with pytest.raises(multibranch.UnsupportedError, match="alignment=True: not with a CTranslate2 directory .*: a "
                                                           "CTranslate2 directory gives no attention weights"):
        ct2.translate("a", alignment=True)
    with pytest.raises(multibranch.UnsupportedError, match="attention: not with a CTranslate2 directory .*: a "
                                                           "CTranslate2 directory gives no attention weights"):
        ct2.attention("a")


def test_attention_of_a_mat_model_has_its_branches(tokenizer, tmp_path):
    """A MAT model (2 branches of 2 heads): per-branch maps are the means of their heads, as POST /attention
    draws a branch."""
    from multibranch.checkpoint.format import save_checkpoint
    from multibranch.experiment import ExperimentConfig
    from multibranch.experiment.decoding import DecodeConfig
    from multibranch.serve.engine import TorchEngine
    from tests.helpers.models import noisy_mat_model
    from tests.helpers.translation import corpus_lines

    model = noisy_mat_model(tokenizer.src_vocab_size)
    decode = DecodeConfig(beam=2, max_len_a=1.0, max_len_b=3)
    path = tmp_path / "mat.pt"
    config = ExperimentConfig(model=model.config, decode=decode).to_dict()
    save_checkpoint(path, {"config": config, "model": model.state_dict(),
                           "tokenizer": tokenizer.to_state(), "meta": {}})
    text = min(corpus_lines(20, seed=31), key=len)
    maps = multibranch.load(path).attention(text)
    engine = TorchEngine(model, tokenizer, decode)
    assert [m.shape[0] for m in maps.heads["cross"]] == [4, 4]
    assert [b.shape[0] for b in maps.branches["cross"]] == [2, 2]
    for kind, layers in maps.heads.items():
        for layer, heads in enumerate(layers):
            for branch in range(2):
                got = maps.map(kind, layer, branch=branch)
                assert torch.allclose(got, heads[2 * branch: 2 * branch + 2].mean(dim=0))
                served = engine.attention(text, kind, layer, branch=branch)
                assert torch.allclose(got, torch.tensor(served["weights"]), atol=1e-6)
    with pytest.raises(multibranch.ConfigError, match="branch=2: layer 0 of the cross attention has branches 0..1"):
        maps.map("cross", 0, branch=2)
