"""Tiny random Hugging Face BERT / RoBERTa directories for the HF import tests (no hub access).

Every weight is perturbed (LayerNorm gains and biases too, token-type and position rows), so a
missing or misplaced mapping shows up in the logits.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

WORDS = "the cat dog sat ran on a red mat far away blue house".split()


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7))) for _ in range(n)]


def _perturb(model: torch.nn.Module) -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)


def bert_tokenizer():
    from transformers import BertTokenizer

    chars = sorted(set("".join(WORDS)))
    vocab = dict.fromkeys(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS[:8], *chars, *("##" + c for c in chars)])
    return BertTokenizer(vocab={v: i for i, v in enumerate(vocab)})


def roberta_tokenizer():
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(sentences(50, seed=1), vocab_size=300, min_frequency=2,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
    vocab = bpe.get_vocab()
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in
              __import__("json").loads(bpe.to_str())["model"]["merges"]]
    return RobertaTokenizer(vocab=vocab, merges=merges)


def bert_dir(directory: Path, num_labels: int = 3, head: bool = True, extra_vocab: int = 0, **config):
    """Save a tiny random BertForSequenceClassification (or BertModel without `head`) with its tokenizer."""
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    tok = bert_tokenizer()
    cfg = BertConfig(vocab_size=len(tok) + extra_vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=24, max_position_embeddings=48, num_labels=num_labels, **config)
    torch.manual_seed(1)
    model = (BertForSequenceClassification if head else BertModel)(cfg)
    _perturb(model)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return model.eval(), tok


def roberta_dir(directory: Path, num_labels: int = 2, **config):
    """Save a tiny random RobertaForSequenceClassification with a byte-level BPE tokenizer."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    tok = roberta_tokenizer()
    cfg = RobertaConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=24, max_position_embeddings=40, num_labels=num_labels, pad_token_id=1,
                        bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5, **config)
    torch.manual_seed(2)
    model = RobertaForSequenceClassification(cfg)
    _perturb(model)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return model.eval(), tok


def padded_batches(tok, texts: list[str], size: int) -> list[torch.Tensor]:
    """HF's ids of `texts` (with CLS/SEP), right-padded with the tokenizer's pad id, `size` per batch."""
    batches = []
    for start in range(0, len(texts), size):
        enc = tok(texts[start : start + size], padding=True, return_tensors="pt")
        batches.append(enc["input_ids"])
    return batches
