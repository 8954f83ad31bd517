"""`multibranch convert`: checkpoint surgery (proximal init, folding, HF Marian import, export).

    multibranch convert proximal --ckpt STD.pt --out MAT.pt --branches N [--ffn-branches N]
                                 [--drop-branch RHO] [--merge mean|mean_sq] [--set model.x=y ...]
    multibranch convert fold     --ckpt MAT.pt --out FOLDED.pt
    multibranch convert from-hf  --model-dir DIR --out OUT.pt
    multibranch convert from-hf-bert --model-dir DIR --out OUT.pt [--labels A,B,... | --num-labels N]
    multibranch convert export   --ckpt X.pt --out DIR
    multibranch convert ct2      --ckpt X.pt --out DIR [--quantization float32|int8|...]
    multibranch convert to-hf    --ckpt X.pt --out DIR

Every output is weights-only (no optimizer/schedule/RNG state); existing outputs are kept unless
--force is given.
"""

from __future__ import annotations

import argparse

HELP = ("checkpoint surgery: proximal init (standard -> MAT), MAT folding, HF Marian / BERT / RoBERTa import, export "
        "(release, CTranslate2, HF Marian)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="convert_command", metavar="CONVERSION", required=True)

    p = sub.add_parser(
        "proximal", help="MAT checkpoint from a trained standard Transformer (weights copied into every branch)"
    )
    p.add_argument("--ckpt", required=True, help="standard Transformer checkpoint (or exported directory)")
    p.add_argument("--out", required=True, help="MAT checkpoint to write")
    p.add_argument("--branches", type=int, required=True, help="attention branches N_a")
    p.add_argument("--ffn-branches", type=int, default=1, help="FFN branches N_f")
    p.add_argument("--drop-branch", type=float, default=None, help="drop-branch rate rho for the MAT (unset: the layer default)")
    p.add_argument("--merge", choices=["mean", "mean_sq"], default=None,
                   help="branch merge constant: mean = 1/N (function-preserving), mean_sq = 1/N^2 (unset: mean)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. model.dropout=0.3 (repeatable; widths cannot change)")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.set_defaults(convert_run=_proximal)

    p = sub.add_parser("fold", help="fold a MAT into one attention of N_a*M heads (same output in eval)")
    p.add_argument("--ckpt", required=True, help="MAT checkpoint (or exported directory)")
    p.add_argument("--out", required=True, help="folded checkpoint to write")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.set_defaults(convert_run=_fold)

    p = sub.add_parser("from-hf", help="import a local Hugging Face MarianMTModel directory (needs transformers)")
    p.add_argument("--model-dir", required=True, help="local directory with config.json and weights (never the hub)")
    p.add_argument("--out", required=True, help="checkpoint to write")
    p.add_argument("--no-tokenizer", action="store_true",
                   help="ignore source.spm/target.spm/vocab.json: keep HF ids (weights-only import)")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.set_defaults(convert_run=_from_hf)

    p = sub.add_parser("from-hf-bert",
                       help="import a local Hugging Face BERT or RoBERTa directory as a classifier (needs transformers)")
    p.add_argument("--model-dir", required=True,
                   help="local directory with config.json, model.safetensors or pytorch_model.bin and the tokenizer "
                        "(never the hub)")
    p.add_argument("--out", required=True, help="classifier checkpoint to write")
    head = p.add_mutually_exclusive_group()
    head.add_argument("--labels", metavar="A,B,...",
                      help="label names in the order `prepare` gives them (sorted): a new head, or the model's own "
                           "head reordered when it has exactly these labels (unset: keep the model's head)")
    head.add_argument("--num-labels", type=int, metavar="N", help="a new classification head with N labels")
    p.add_argument("--seed", type=int, default=1, help="seed of a new head's random initialisation")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.set_defaults(convert_run=_from_hf_bert)

    p = sub.add_parser("export", help="write model.safetensors + config.json + SentencePiece model(s) to a directory")
    p.add_argument("--ckpt", required=True, help="checkpoint to export")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32",
                   help="type of the stored weights: fp16/bf16 halve the files; the model loads as fp32 holding the "
                        "rounded values (what --precision fp16/bf16 decodes with on CUDA)")
    p.add_argument("--force", action="store_true", help="overwrite files in a non-empty --out")
    p.set_defaults(convert_run=_export)

    p = sub.add_parser("ct2", help="write a CTranslate2 model directory (standard or MAT; needs ctranslate2)")
    p.add_argument("--ckpt", required=True, help="standard or MAT checkpoint (or exported directory)")
    p.add_argument("--out", required=True, help="output directory (written beside it, then swapped in)")
    p.add_argument("--quantization", default="float32", metavar="TYPE",
                   help="CTranslate2 weight type: float32, int8, int8_float32, int16, float16, ... "
                        "(checked against the list in multibranch.convert.ct2)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.set_defaults(convert_run=_ct2)

    p = sub.add_parser("to-hf", help="write a Hugging Face MarianMTModel folder with its MarianTokenizer files "
                                     "(standard models; needs transformers)")
    p.add_argument("--ckpt", required=True, help="standard checkpoint, or a MAT with FFN branches only "
                                                 "(or exported directory)")
    p.add_argument("--out", required=True, help="output folder (written beside it, then swapped in)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.set_defaults(convert_run=_to_hf)


def run(args: argparse.Namespace) -> int:
    return int(args.convert_run(args) or 0)


def _proximal(args: argparse.Namespace) -> int:
    from multibranch.checkpoint.format import load_checkpoint, save_checkpoint
    from multibranch.convert.payload import refuse_overwrite
    from multibranch.convert.proximal import proximal_init
    from multibranch.data.directories import CHECKPOINT, refuse_replacing
    from multibranch.data.text import check_output_file

    check_output_file(args.out, [args.ckpt], parent_must_exist=False)
    refuse_replacing(args.out, CHECKPOINT)
    refuse_overwrite(args.out, args.force)
    layer: dict[str, object] = {}
    if args.drop_branch is not None:
        layer["drop_branch"] = args.drop_branch
    if args.merge is not None:
        layer["branch_merge"] = args.merge
    payload = proximal_init(
        load_checkpoint(args.ckpt), args.branches, args.ffn_branches, layer, overrides=args.set, source=str(args.ckpt)
    )
    save_checkpoint(args.out, payload)
    conv = payload["meta"]["conversion"]
    sides = [side for side in ("encoder", "decoder") if side in conv]  # a classifier has only an encoder
    names = "/".join("enc" if side == "encoder" else "dec" for side in sides)
    print(
        f"wrote {args.out}: MAT with attention branches {names} "
        f"{'/'.join(str(conv[side]['attention_branches']) for side in sides)}, FFN branches "
        f"{'/'.join(str(conv[side]['ffn_branches']) for side in sides)}; train it with a fresh optimizer and LR "
        "schedule (--init-from)"
    )
    return 0


def _fold(args: argparse.Namespace) -> int:
    from multibranch.checkpoint.format import load_checkpoint, save_checkpoint
    from multibranch.convert.fold import fold_mat
    from multibranch.convert.payload import refuse_overwrite
    from multibranch.data.directories import CHECKPOINT, refuse_replacing
    from multibranch.data.text import check_output_file

    check_output_file(args.out, [args.ckpt], parent_must_exist=False)
    refuse_replacing(args.out, CHECKPOINT)
    refuse_overwrite(args.out, args.force)
    payload = fold_mat(load_checkpoint(args.ckpt), source=str(args.ckpt))
    save_checkpoint(args.out, payload)
    conv = payload["meta"]["conversion"]
    if all(side["attention_branches"] == 1 and side["ffn_branches"] == 1 for side in conv["before"].values()):
        print(f"wrote {args.out}: the same model (one attention and one FFN branch: nothing to fold)")
        return 0
    ffn = "and FFN branches" if conv["ffn_folded"] else "(FFN branches kept: encoder/decoder N_f differ)"
    print(f"wrote {args.out}: attention branches folded into heads {ffn}")
    return 0


def _from_hf(args: argparse.Namespace) -> int:
    from multibranch.checkpoint.format import save_checkpoint
    from multibranch.convert.hf_marian import import_marian
    from multibranch.convert.payload import refuse_overwrite
    from multibranch.data.directories import CHECKPOINT, refuse_replacing

    refuse_replacing(args.out, CHECKPOINT)
    refuse_overwrite(args.out, args.force)
    payload = import_marian(args.model_dir, use_tokenizer=not args.no_tokenizer)
    save_checkpoint(args.out, payload)
    conv = payload["meta"]["conversion"]
    print(f"wrote {args.out}: {conv['summary']}")
    return 0


def _from_hf_bert(args: argparse.Namespace) -> int:
    from multibranch.checkpoint.format import save_checkpoint
    from multibranch.convert.hf_bert import import_bert
    from multibranch.convert.payload import refuse_overwrite
    from multibranch.data.directories import CHECKPOINT, refuse_replacing
    from multibranch.data.text import check_output_file

    check_output_file(args.out, [], parent_must_exist=False)
    refuse_replacing(args.out, CHECKPOINT)
    refuse_overwrite(args.out, args.force)
    labels = [name.strip() for name in args.labels.split(",")] if args.labels is not None else None
    payload = import_bert(args.model_dir, labels=labels, num_labels=args.num_labels, seed=args.seed)
    save_checkpoint(args.out, payload)
    print(f"wrote {args.out}: {payload['meta']['conversion']['summary']}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from multibranch.checkpoint.format import load_checkpoint
    from multibranch.convert.export import export_release

    files = export_release(load_checkpoint(args.ckpt), args.out, force=args.force, dtype=args.dtype,
                           source=args.ckpt)
    print(f"exported {args.ckpt} to {args.out} ({args.dtype} weights): {', '.join(p.name for p in files)}")
    return 0


def _ct2(args: argparse.Namespace) -> int:
    from multibranch.checkpoint.format import load_checkpoint
    from multibranch.convert.ct2 import export_ct2

    out = export_ct2(load_checkpoint(args.ckpt), args.out, quantization=args.quantization, force=args.force,
                     source=str(args.ckpt))
    print(f"wrote {out}: CTranslate2 model ({args.quantization}) with its SentencePiece model(s)")
    return 0


def _to_hf(args: argparse.Namespace) -> int:
    from multibranch.checkpoint.format import load_checkpoint
    from multibranch.convert.hf_marian_export import export_marian

    out = export_marian(load_checkpoint(args.ckpt), args.out, force=args.force, source=str(args.ckpt))
    print(f"wrote {out}: Hugging Face MarianMTModel + MarianTokenizer files (load with from_pretrained)")
    return 0
