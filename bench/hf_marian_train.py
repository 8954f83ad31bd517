"""Train Hugging Face MarianMTModel (the peer) on prepared Multi30k for a fixed number of minutes.

Same architecture as the transformer-tiny preset, the same token batches (our length-bucketed
batches, epoch by epoch), the same schedule (inverse-sqrt warm-up, AdamW (0.9, 0.98)) and label
smoothing; HF's own initialisation and model code, fp32 as a user gets by default. Then beam search
with HF `generate` (beam 5, length penalty 1.0, early_stopping=True, at most 1.2*src+10 new tokens)
on the test split, detokenised with the same SentencePiece model, scored with sacreBLEU.

    python bench/hf_marian_train.py --data runs/bench/m30k-data-8000 --out runs/bench/quality/hf-marian --minutes 20
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import hf_update  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--preset", default="transformer-tiny")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)

    import transformers

    from bench.decode_speed import hf_translate
    from multibranch.convert.hf_marian_export import marian_config
    from multibranch.data.batching import collate, token_batches
    from multibranch.evaluate.metrics import score_corpus
    from multibranch.experiment import resolve_config
    from multibranch.schedules import learning_rate_at
    from multibranch.tasks.translation.dataset import PreparedData

    data = PreparedData.load(args.data)
    tokenizer = data.tokenizer()
    cfg = resolve_config(args.preset, None, [])
    m = cfg.model
    m.src_vocab_size = m.tgt_vocab_size = tokenizer.tgt_vocab_size
    m.pad_id, m.bos_id, m.eos_id = tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    model = transformers.MarianMTModel(marian_config(transformers, m, beam=cfg.decode.beam)).train()
    t = cfg.train
    optimizer = torch.optim.AdamW(model.parameters(), lr=t.lr.lr, betas=tuple(t.betas), eps=t.adam_eps,
                                  weight_decay=t.weight_decay)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=m.pad_id, label_smoothing=t.label_smoothing, reduction="sum")
    split = data.split("train")
    step, epoch, tokens = 0, 1, 0
    start = time.perf_counter()
    deadline = start + 60 * args.minutes
    while time.perf_counter() < deadline:
        for indices in token_batches(split.src_lengths, split.tgt_lengths, t.max_tokens, seed=t.seed, epoch=epoch):
            if time.perf_counter() >= deadline:
                break
            batch = collate(split, indices, m.pad_id, m.bos_id, m.eos_id)
            step += 1
            for group in optimizer.param_groups:
                group["lr"] = learning_rate_at(t.lr, step, m.d_model)
            hf_update(model, optimizer, loss_fn, batch, m.pad_id, clip_norm=t.clip_norm)
            tokens += batch.n_tgt_tokens
        else:
            epoch += 1
    train_seconds = time.perf_counter() - start
    model.eval()
    test = data.split("test")
    sources, references = test.raw_src_lines(), test.raw_tgt_lines()
    t0 = time.perf_counter()
    with torch.inference_mode():
        hyps = hf_translate(model, tokenizer, sources, beam=cfg.decode.beam, batch=32, cfg=m)
    translate_s = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "test.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    scores = score_corpus(hyps, [references], metrics=("bleu", "chrf"))
    result = {"parameters": sum(p.numel() for p in model.parameters()), "updates": step, "epochs_started": epoch,
              "train_minutes": train_seconds / 60, "tokens_per_s": tokens / train_seconds,
              "best": {"bleu": scores["bleu"]["score"], "chrf": scores["chrf"]["score"],
                       "signature": scores["bleu"]["signature"], "translate_s": translate_s},
              "note": "final model (no validation / checkpoint selection), HF generate beam 5, fp32"}
    (args.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
