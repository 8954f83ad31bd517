"""Sentence-pair classifiers from imported BERT / RoBERTa: logits equal HF's on pairs (token-type embeddings
mapped), fine-tuning with DropHead and from MAT proximal init on pair data, `classify` on TSV pairs,
`serve /classify` with {"pairs": ...}, and the one-line refusals of the wrong kind of input."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("fastapi")
from multibranch.checkpoint.format import load_checkpoint, load_state_strict  # noqa: E402
from multibranch.cli import main  # noqa: E402
from multibranch.convert.hf_bert import import_bert  # noqa: E402
from multibranch.experiment import ExperimentConfig  # noqa: E402
from multibranch.loading.checkpoint import load_model  # noqa: E402
from multibranch.serve.app import create_app  # noqa: E402
from multibranch.serve.engine import load_torch_engine  # noqa: E402
from multibranch.serve.limits import ServeLimits  # noqa: E402
from multibranch.tasks import build_task_model  # noqa: E402
from tests.helpers.cli import one_error_line  # noqa: E402
from tests.helpers.hf_bert import bert_dir, roberta_dir, sentences  # noqa: E402
from tests.helpers.serve import run, serving  # noqa: E402

FIRSTS, SECONDS = sentences(10, seed=8), sentences(10, seed=9)


def _ours(payload: dict) -> torch.nn.Module:
    net = build_task_model(ExperimentConfig.from_dict(payload["config"]))
    load_state_strict(net, payload["model"], "import")
    return net.eval()


@pytest.mark.parametrize("build", [bert_dir, roberta_dir], ids=["bert", "roberta"])
def test_pair_logits_equal_hf(tmp_path, build):
    """HF's padded pair batches (input ids, attention mask, token-type ids) vs ours from the input ids alone."""
    hf, tok = build(tmp_path / "hf")
    payload = import_bert(tmp_path / "hf")
    net = _ours(payload)
    if build is bert_dir:  # the token-type table is a table of its own, not folded into the positions
        torch.testing.assert_close(payload["model"]["encoder.embed.segments.weight"],
                                   hf.bert.embeddings.token_type_embeddings.weight.detach())
    for start in (0, 5):
        enc = tok(FIRSTS[start : start + 5], SECONDS[start : start + 5], padding=True, return_tensors="pt")
        assert enc["input_ids"].eq(tok.pad_token_id).any()
        with torch.no_grad():
            expected = hf(**enc).logits  # [B, C]
            got = net(enc["input_ids"])
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def _pairs_tsv(path, firsts, seconds) -> None:
    """GLUE-like TSV; label `same` when the two texts share their first word."""
    rows = ["index\tsentence1\tsentence2\tlabel"]
    rows += [f"{i}\t{a}\t{b}\t{'same' if a.split()[0] == b.split()[0] else 'other'}"
             for i, (a, b) in enumerate(zip(firsts, seconds))]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory):
    """(root, HF tokenizer, imported single-text checkpoint, DropHead pair run's best.pt, MAT pair run's best.pt)."""
    root = tmp_path_factory.mktemp("pairs")
    _, tok = bert_dir(root / "hf", num_labels=2)
    firsts = sentences(60, seed=1) + [w + " cat" for w in ("the", "a", "red", "dog")] * 5
    seconds = sentences(60, seed=2) + [w + " mat" for w in ("the", "a", "red", "dog")] * 5
    _pairs_tsv(root / "train.tsv", firsts, seconds)
    imported, mat_init = root / "import.pt", root / "mat-init.pt"
    assert main(["convert", "from-hf-bert", "--model-dir", str(root / "hf"), "--labels", "other,same",
                 "--out", str(imported)]) == 0
    assert main(["convert", "proximal", "--ckpt", str(imported), "--branches", "2", "--out", str(mat_init)]) == 0
    assert main(["prepare", "--task", "classify", "--train", str(root / "train.tsv"), "--holdout", "10",
                 "--label-column", "label", "--text-column", "sentence1", "--text-column", "sentence2",
                 "--hf-tokenizer", str(root / "hf"), "--max-len", "40", "--out", str(root / "data")]) == 0
    short = ["--max-steps", "3", "--valid-every", "3", "--lr", "1e-3", "--warmup", "1", "--no-progress",
             "--threads", "1", "--set", "train.max_sentences=8"]
    assert main(["train", "--data", str(root / "data"), "--out", str(root / "drophead"), "--init-from", str(imported),
                 *short, "--set", "model.drophead.rate.rate=0.3"]) == 0
    assert main(["train", "--data", str(root / "data"), "--out", str(root / "mat"), "--init-from", str(mat_init),
                 *short]) == 0
    return root, tok, imported, root / "drophead" / "best.pt", root / "mat" / "best.pt"


def test_drophead_and_mat_fine_tune_on_pairs(pair_run):
    root, _, imported, drophead, mat = pair_run
    start = load_checkpoint(imported)
    for best, branches in ((drophead, 1), (mat, 2)):
        payload = load_checkpoint(best)
        assert payload["config"]["classifier"]["pairs"] is True
        assert payload["config"]["model"]["segments"] == 2
        assert payload["config"]["model"]["encoder"]["attention_branches"] == branches
        moved = not torch.equal(payload["model"]["encoder.embed.segments.weight"],
                                start["model"]["encoder.embed.segments.weight"])
        assert moved  # segment 1 is trained on the pairs
    assert load_checkpoint(drophead)["config"]["model"]["drophead"]["rate"]["rate"] == 0.3


def test_proximal_init_of_a_pair_model_keeps_its_pair_logits(pair_run, tmp_path, capsys):
    _, tok, _, drophead, _ = pair_run
    mat = tmp_path / "mat.pt"
    assert main(["convert", "proximal", "--ckpt", str(drophead), "--branches", "3", "--out", str(mat)]) == 0
    std, branched = load_model(drophead, task="classification"), load_model(mat, task="classification")
    assert branched.config.classifier.pairs
    enc = tok(FIRSTS, SECONDS, padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(branched.model(enc["input_ids"]), std.model(enc["input_ids"]), atol=1e-5, rtol=0)


def _expected_probs(ckpt, tok, firsts, seconds) -> torch.Tensor:
    """Each pair alone through the model as the HF tokenizer encodes it (no batching, no padding)."""
    model = load_model(ckpt, task="classification").model.eval()
    with torch.no_grad():
        return torch.stack([model(torch.tensor([tok(a, b)["input_ids"]]))[0].softmax(-1)
                            for a, b in zip(firsts, seconds)])


def test_classify_tsv_pairs_and_refusals(pair_run, tmp_path, capsys):
    root, tok, imported, best, _ = pair_run
    lines = [f"{a}\t{b}" for a, b in zip(FIRSTS, SECONDS)]
    (tmp_path / "in.tsv").write_text("\n".join(lines[:4] + [""] + lines[4:]) + "\n", encoding="utf-8")
    assert main(["classify", "--ckpt", str(best), "-i", str(tmp_path / "in.tsv"), "-o", str(tmp_path / "out.txt"),
                 "--probs"]) == 0
    out = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")
    assert out[4] == "" and len(out) == len(lines) + 2  # the empty line, then the final newline
    got = torch.tensor([[float(x.split("=")[1]) for x in line.split("\t")[1].split()] for line in out[:4] + out[5:-1]])
    torch.testing.assert_close(got, _expected_probs(best, tok, FIRSTS, SECONDS), atol=1e-4, rtol=0)

    def refused(ckpt, text: str, expected: str) -> None:
        (tmp_path / "bad.tsv").write_text(text, encoding="utf-8")
        assert main(["classify", "--ckpt", str(ckpt), "-i", str(tmp_path / "bad.tsv"), "-o",
                     str(tmp_path / "bad-out.txt")]) == 2
        assert expected in one_error_line(capsys)
        assert not (tmp_path / "bad-out.txt").exists()

    refused(best, "a cat\nthe dog\n", "bad.tsv:1: 1 tab-separated column(s); the classifier reads sentence pairs")
    refused(best, "a cat\tthe dog\tred\n", "bad.tsv:1: 3 tab-separated column(s)")
    refused(best, "a cat\tthe dog\nthe mat\t \n", "bad.tsv:2: empty second text of the pair")
    refused(imported, "a cat\tthe dog\nthe mat\ta dog\n", "(sentence pairs), but the classifier classifies single")


def test_serve_classify_pairs(pair_run):
    _, tok, imported, best, _ = pair_run
    engine = load_torch_engine(str(best), "cpu")
    single = load_torch_engine(str(imported), "cpu")
    pairs = [[a, b] for a, b in zip(FIRSTS, SECONDS)]

    async def scenario() -> None:
        async with serving(create_app(engine, ServeLimits(max_wait_ms=0))) as client:
            answer = await client.post("/classify", json={"pairs": pairs + [["", " "]], "probs": True})
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["labels"][-1] is None and body["probabilities"][-1] is None
            got = torch.tensor([[p[name] for name in engine.labels] for p in body["probabilities"][:-1]])
            torch.testing.assert_close(got, _expected_probs(best, tok, FIRSTS, SECONDS), atol=1e-5, rtol=0)
            for request, expected in (({"texts": FIRSTS}, "reads sentence pairs"),
                                      ({"pairs": [["a cat", ""]]}, "pairs[0]: empty second text"),
                                      ({"pairs": pairs, "texts": FIRSTS}, "exactly one of")):
                answer = await client.post("/classify", json=request)
                assert answer.status_code == 422 and expected in answer.text, answer.text
            answer = await client.post("/classify", json={"pairs": [["a", "b", "c"]]})
            assert answer.status_code == 422
        async with serving(create_app(single, ServeLimits(max_wait_ms=0))) as client:
            answer = await client.post("/classify", json={"pairs": pairs})
            assert answer.status_code == 422 and "reads single texts" in answer.text

    run(scenario())
