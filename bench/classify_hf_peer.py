"""The Hugging Face peer of the `-minilm` fine-tuning presets: `Trainer` + `AutoModelForSequenceClassification`
on the same prepared split, with the preset's own budget (updates, batch size, lr, warm-up, schedule, weight
decay, validation interval; the best checkpoint by valid accuracy, as `multibranch train` keeps best.pt).

It reads the split's raw texts (`{split}.txt`: one text, or for sentence pairs `a<TAB>b`, per line) and
labels from a directory written by `multibranch prepare --task classify`, tokenizes them with the model's
own tokenizer (`tokenizer(a, b, truncation=True)` for pairs, cut to the data's max_len + 2), and writes
one predicted label per test example. Run by bench/classify_quality.py in its own process, which measures
its CPU time; needs `transformers` and `accelerate` (the bench extra).

    python bench/classify_hf_peer.py --data DIR --model-dir MINILM --preset rte-minilm --seed 1 --out labels.txt
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def read_examples(data: Path, split: str) -> tuple[list[list[str]], list[int]]:
    """(per example its one or two texts, label ids) of a prepared split."""
    texts = (data / f"{split}.txt").read_text(encoding="utf-8").split("\n")[:-1]
    pairs = json.loads((data / "data.json").read_text(encoding="utf-8")).get("pairs", False)
    examples = [line.split("\t", 1) if pairs else [line] for line in texts]
    return examples, np.load(data / f"{split}.labels.npy").tolist()


class Examples:
    """A torch dataset of tokenized examples (dicts of lists; the collator pads them)."""

    def __init__(self, tokenizer, examples: list[list[str]], labels: list[int], max_length: int):
        self.encodings = [tokenizer(*texts, truncation=True, max_length=max_length) for texts in examples]
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {**self.encodings[i], "labels": self.labels[i]}


def predict_in_order(model, collator, examples: Examples, batch_size: int, bf16: bool) -> list[int]:
    """The predicted label id of every example, in the dataset's order. Not `Trainer.predict`: with
    `train_sampling_strategy="group_by_length"`, transformers 5 also length-groups (and so reorders) the
    evaluation batches, and its predictions then do not line up with the test labels."""
    import torch

    model.eval()
    predictions: list[int] = []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for start in range(0, len(examples), batch_size):
            batch = collator([examples.encodings[i] for i in range(start, min(start + batch_size, len(examples)))])
            predictions += model(**batch).logits.argmax(-1).tolist()
    return predictions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--preset", required=True, help="the multibranch preset whose budget the peer gets")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-steps", type=int, help="shorten the run (a smoke test)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bf16", action="store_true", help="train under bf16 autocast (Trainer's bf16=True)")
    parser.add_argument("--out", type=Path, required=True, help="predicted label names of the test split")
    args = parser.parse_args()

    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    from multibranch.experiment import resolve_config

    torch.set_num_threads(args.threads)
    train_cfg = resolve_config(args.preset).train
    meta = json.loads((args.data / "data.json").read_text(encoding="utf-8"))
    labels = meta["labels"]
    max_length = (meta["config"]["max_len"] or 510) + 2  # prepare's max_len counts no CLS/SEP around the text(s)
    steps = args.max_steps or train_cfg.max_steps
    every = min(train_cfg.valid_every, steps)
    tokenizer = AutoTokenizer.from_pretrained(str(args.model_dir), local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(args.model_dir), local_files_only=True, num_labels=len(labels),
        id2label=dict(enumerate(labels)), label2id={name: i for i, name in enumerate(labels)})
    train, valid, test = (Examples(tokenizer, *read_examples(args.data, split), max_length)
                          for split in ("train", "valid", "test"))

    def accuracy(prediction) -> dict[str, float]:
        return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}

    with tempfile.TemporaryDirectory() as scratch:
        options = TrainingArguments(
            output_dir=scratch, max_steps=steps, per_device_train_batch_size=train_cfg.max_sentences,
            per_device_eval_batch_size=64, learning_rate=train_cfg.lr.lr, warmup_steps=min(train_cfg.lr.warmup, steps),
            lr_scheduler_type="cosine" if train_cfg.lr.schedule == "cosine" else "linear",
            weight_decay=train_cfg.weight_decay, adam_beta1=train_cfg.betas[0], adam_beta2=train_cfg.betas[1],
            eval_strategy="steps", eval_steps=every, save_strategy="steps", save_steps=every, save_total_limit=1,
            load_best_model_at_end=True, metric_for_best_model="accuracy", seed=args.seed, data_seed=args.seed,
            bf16=args.bf16, train_sampling_strategy="group_by_length",
            use_cpu=True, report_to=[], logging_steps=every, dataloader_num_workers=0, disable_tqdm=True)
        trainer = Trainer(model=model, args=options, train_dataset=train, eval_dataset=valid,
                          data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=accuracy)
        trainer.train()
        best_valid = trainer.state.best_metric
    predictions = predict_in_order(trainer.model, DataCollatorWithPadding(tokenizer), test, 64, args.bf16)
    args.out.write_text("".join(labels[int(i)] + "\n" for i in predictions), encoding="utf-8")
    print(json.dumps({"best_valid_accuracy": best_valid, "updates": steps}))


if __name__ == "__main__":
    main()
