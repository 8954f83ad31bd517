"""Classifier training speed: our classifier vs Hugging Face BertForSequenceClassification of equal size.

Both systems train on the *same* batches: our token-budget batches (length-bucketed, `train.max_tokens`
of the preset) of epoch 1 of the prepared TREC-6 (or SST-2) training split of bench/classify_quality.py.
The HF model has the preset's d, layers, heads, FFN width, activation, dropout, vocabulary and
max positions, post-norm layers, the same pooling head (first token -> dense + tanh -> dropout ->
labels) and one token type; it keeps what BERT has and ours does not (learned position table,
embedding LayerNorm), so the parameter counts are printed side by side. Both use AdamW with the
preset's betas, eps and weight decay, cross-entropy summed over the batch divided by its sentences,
gradient clipping when the preset clips, and the same autocast (`--amp none` = fp32, `bf16`).
Each system runs in its own process (own peak RSS); `--warmup` updates, then `--steps` timed
updates; rounds alternate the systems and the median round is reported (sentences/s, non-pad
tokens/s, ms/update).

    python bench/classify_speed.py --amp none   # and --amp bf16
    python bench/classify_speed.py --steps 3 --warmup 1 --rounds 1 --name classify_speed_smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.classify_quality import DATASETS, prepared, work_dir  # noqa: E402
from bench.common import environment, peak_rss_mb, run_isolated, save_results, trainer_and_batches  # noqa: E402

SYSTEMS = ("hf-bert", "multibranch")


def hf_bert(cfg, num_labels: int):
    """BertForSequenceClassification with the sizes of our classifier config."""
    from transformers import BertConfig, BertForSequenceClassification

    m = cfg.model
    if m.norm != "post" or cfg.classifier.pooling != "first":
        raise SystemExit("the BERT peer is post-norm with first-token pooling: use a preset with norm: post, "
                         "classifier.pooling: first (or --set those)")
    config = BertConfig(vocab_size=m.src_vocab_size, hidden_size=m.d_model, num_hidden_layers=m.encoder_layers,
                        num_attention_heads=m.heads, intermediate_size=m.ffn_dim, hidden_act=m.activation,
                        hidden_dropout_prob=m.dropout, attention_probs_dropout_prob=m.attention_dropout,
                        max_position_embeddings=m.max_positions, type_vocab_size=1, pad_token_id=m.pad_id,
                        num_labels=num_labels, classifier_dropout=m.dropout, layer_norm_eps=1e-5)
    return BertForSequenceClassification(config)


def child(system: str, preset: str, dataset: str, steps: int, warmup: int, amp: str, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    from multibranch.experiment import resolve_config

    data = prepared(dataset, work_dir() / "classify" / f"{dataset}-prepare.log")
    cfg = resolve_config(preset, None, [f"train.amp={amp}", "train.max_steps=100000", "train.max_minutes=null"])
    with trainer_and_batches(cfg, warmup + steps, data=data) as (trainer, batches):
        pad = cfg.model.pad_id
        if system == "hf-bert":
            num_labels = cfg.classifier.num_labels
            del trainer.model, trainer.optimizer, trainer.train_model  # this process measures HF only
            torch.manual_seed(1)
            model = hf_bert(cfg, num_labels).train()
            step = hf_step_fn(model, cfg.train, amp, pad)
        else:
            model = trainer.model

            def step(batch):
                trainer._update([batch])
        params = sum(p.numel() for p in model.parameters())
        for batch in batches[:warmup]:
            step(batch)
        start = time.perf_counter()
        for batch in batches[warmup:]:
            step(batch)
        seconds = time.perf_counter() - start
    timed = batches[warmup:]
    sentences = sum(len(b) for b in timed)
    tokens = sum(int(b.src.ne(pad).sum()) for b in timed)
    return {"system": system, "sentences_per_s": sentences / seconds, "tokens_per_s": tokens / seconds,
            "ms_per_update": 1000 * seconds / steps, "sentences": sentences, "tokens": tokens, "updates": steps,
            "peak_rss_mb": peak_rss_mb(), "parameters": params, "amp": amp, "preset": preset, "dataset": dataset,
            "threads": threads}


def hf_step_fn(model, train_cfg, amp: str, pad: int):
    """One update as an HF user writes it: forward, CE summed / sentences on fp32 logits, AdamW."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=train_cfg.lr.lr, betas=tuple(train_cfg.betas),
                                  eps=train_cfg.adam_eps, weight_decay=train_cfg.weight_decay, foreach=True)

    def step(batch) -> None:
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if amp == "bf16" else contextlib.nullcontext()
        with autocast:
            logits = model(input_ids=batch.src, attention_mask=batch.src.ne(pad)).logits
        loss = torch.nn.functional.cross_entropy(logits.float(), batch.labels, reduction="sum")
        (loss / len(batch)).backward()
        if train_cfg.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="trec6", choices=list(DATASETS))
    parser.add_argument("--preset", help="our classifier preset (default: <dataset>-tiny)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--amp", default="none", choices=["none", "bf16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", help="results file name (default classify_speed_<amp>)")
    parser.add_argument("--child", choices=SYSTEMS)
    args = parser.parse_args()
    preset = args.preset or f"{args.dataset}-tiny"
    if args.child:
        print(json.dumps(child(args.child, preset, args.dataset, args.steps, args.warmup, args.amp, args.threads)))
        return
    prepared(args.dataset, work_dir() / "classify" / f"{args.dataset}-prepare.log")  # once, outside the timed children
    runs: dict[str, list[dict]] = {s: [] for s in SYSTEMS}
    for _ in range(args.rounds):
        for system in SYSTEMS:
            runs[system].append(run_isolated([
                "bench/classify_speed.py", "--child", system, "--dataset", args.dataset, "--preset", preset,
                "--steps", str(args.steps), "--warmup", str(args.warmup), "--amp", args.amp,
                "--threads", str(args.threads)]))
            print(json.dumps(runs[system][-1]), flush=True)
    rows = []
    for results in runs.values():
        ordered = sorted(results, key=lambda r: r["sentences_per_s"])
        median = dict(ordered[len(ordered) // 2])
        median["sentences_per_s_all"] = [r["sentences_per_s"] for r in results]
        rows.append(median)
    hf = rows[0]
    print("\n| system | params | sentences/s | tokens/s | ms/update | peak RSS MB | vs HF sentences/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['system']} | {r['parameters'] / 1e6:.2f}M | {r['sentences_per_s']:.0f} | {r['tokens_per_s']:.0f} | "
              f"{r['ms_per_update']:.0f} | {r['peak_rss_mb']:.0f} | {r['sentences_per_s'] / hf['sentences_per_s']:.2f}x |")
    path = save_results(args.name or f"classify_speed_{args.amp}", {"environment": environment(amp=args.amp), "rows": rows})
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
