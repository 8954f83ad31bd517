"""Decoding a CTranslate2 directory (`multibranch convert ct2`) the way our Translator decodes a checkpoint.

`Ct2Translator` has the Translator's interface (`translate`, `translate_nbest`, `score`, `stats`,
`cfg`), so `multibranch translate` and `serve --engine ct2` read the same directory the same way:
- empty / whitespace-only lines give "" without running the model;
- every other line becomes its source SentencePiece pieces; CTranslate2 appends EOS
  (`add_source_eos`); a line longer than the directory's position table (`max_positions` in its
  settings; ours truncate at the model's `max_positions` too) or `max_input_tokens` is truncated, never
  dropped, with one warning per call naming the lines, or refused (`long_inputs`), as the Translator does;
- the decode settings are the checkpoint's, stored in the settings file at conversion, with the
  overrides given; `CT2_MAPPING` says, per DecodeConfig field, the CTranslate2 option it becomes or why
  it cannot; `translate_options` maps them to `translate_batch` keyword arguments that reproduce our
  beam search, `max_decoding_length` our output length limit.

ctranslate2 is an optional extra, imported only when a directory is opened.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from multibranch.checkpoint.export import check_recorded_sha256
from multibranch.checkpoint.format import CT2_SETTINGS_FILE
from multibranch.config import ConfigError
from multibranch.data.tokenizer import Tokenizer
from multibranch.errors import CheckpointError, DataError, UserError
from multibranch.experiment.decoding import DecodeConfig
from multibranch.inference.processors import length_penalty
from multibranch.json_file import read_json_object
from multibranch.tasks.translation.translator import (
    ForcedScore,
    Progress,
    TranslationStats,
    long_lines,
    progress_bar,
    warn_truncated,
)

MODEL_FILES = ("model.bin", "config.json")
# CTranslate2 stores one shared vocabulary or one per side (.json since 3.x, .txt before)
VOCABULARY_FILES = (("shared_vocabulary",), ("source_vocabulary", "target_vocabulary"))
END = "</s>"


def is_ct2_directory(path: str | Path) -> bool:
    """Whether `path` is a directory written by `multibranch convert ct2` (it holds the settings file)."""
    return (Path(path) / CT2_SETTINGS_FILE).is_file()


@dataclass(frozen=True)
class Ct2Mapping:
    """How one DecodeConfig field reaches CTranslate2: `option`, the CTranslate2 option it sets (None: none),
    `value`, its value in `translate_options` (None: set elsewhere, or not at all), and `note`: how, or why not."""

    option: str | None
    note: str
    value: Callable[[DecodeConfig], Any] | None = None


_SAMPLING = ("sampling is not mapped onto CTranslate2's options (its sampling_topk / sampling_topp / "
             "sampling_temperature draw from its own generator); decode the checkpoint instead")
_INPUT_LIMIT = ("applied before CTranslate2: `Ct2Translator` truncates (with one warning) or refuses a longer line; "
                "max_input_length=0 turns CTranslate2's own truncation off")
_OUTPUT_LIMIT = ("max_decoding_length per source length (`max_decoding_length`: our limit plus the EOS); CTranslate2 "
                 "takes one limit per call, so `Ct2Translator` groups the sentences by limit")

# Every DecodeConfig field: the CTranslate2 option it maps to, or why it cannot (a new field needs an entry).
CT2_MAPPING: dict[str, Ct2Mapping] = {
    "beam": Ct2Mapping("beam_size", "the same beam search: fairseq's, with 2K candidates, EOS among the top K "
                                    "finishing a hypothesis and K finished ones ending a sentence", lambda d: d.beam),
    "length_penalty": Ct2Mapping("length_penalty", "score / len^alpha; with return_end_token=True len counts "
                                                   "the EOS, as ours does", lambda d: d.length_penalty),
    "length_penalty_kind": Ct2Mapping(None, "only 'fairseq': CTranslate2 has no GNMT penalty (`translate_options` "
                                            "raises ConfigError for any other)"),
    "max_len_a": Ct2Mapping("max_decoding_length", _OUTPUT_LIMIT),
    "max_len_b": Ct2Mapping("max_decoding_length", _OUTPUT_LIMIT),
    "min_len": Ct2Mapping("min_decoding_length", "CTranslate2 removes EOS before its log-softmax (renormalising), "
                                                 "ours after it", lambda d: d.min_len),
    "nbest": Ct2Mapping("num_hypotheses", "the n best finished hypotheses", lambda d: d.nbest),
    "batch_tokens": Ct2Mapping(None, "not used: CTranslate2 is given batches of sentences (batch_size)"),
    "batch_size": Ct2Mapping("max_batch_size", "passed by `Ct2Translator` with each call"),
    "max_input_tokens": Ct2Mapping(None, _INPUT_LIMIT),
    "long_inputs": Ct2Mapping(None, _INPUT_LIMIT),
    "no_repeat_ngram_size": Ct2Mapping("no_repeat_ngram_size", "CTranslate2 blocks before its log-softmax, ours "
                                                               "after it", lambda d: d.no_repeat_ngram_size),
    "sampling": Ct2Mapping(None, _SAMPLING),
    "temperature": Ct2Mapping(None, _SAMPLING),
    "top_k": Ct2Mapping(None, _SAMPLING),
    "top_p": Ct2Mapping(None, _SAMPLING),
    "seed": Ct2Mapping(None, _SAMPLING),
    "fixed_shapes": Ct2Mapping(None, "not applicable: CTranslate2 runs its own engine"),
}
# what every call passes whatever the config: scores, the EOS kept (our length penalty counts it), no input limit
CT2_FIXED_OPTIONS: dict[str, Any] = {"return_end_token": True, "return_scores": True, "max_input_length": 0}


def translate_options(decode: DecodeConfig) -> dict[str, Any]:
    """`Translator.translate_batch` keyword arguments equal to our beam search with `decode` (`CT2_MAPPING`), except
    `max_decoding_length`, which depends on the source length (see `max_decoding_length`).

    CT2's beam search is fairseq's, as ours (2K candidates, EOS among the top K finishes a hypothesis,
    stop at K finished); with return_end_token=True its length penalty counts EOS, as ours does
    (strip the final "</s>" from the tokens). Known differences: at the length limit ours forces
    EOS while CT2 ends on its best tokens; before min_len CT2 removes EOS before the log-softmax
    (renormalising), ours after it, so with min_len >= 1 scores differ by log(1 - p(EOS)) of the
    first step; when the step that completes K hypotheses finishes several at once, CT2 ranks all
    of them, ours the first K by raw score; with length_penalty 0 CT2 stops as soon as the best
    beam ends; and no_repeat_ngram_size removes the blocked tokens before CT2's log-softmax (after
    ours), so with it scores, and then sometimes the chosen beams, differ."""
    if decode.length_penalty_kind != "fairseq":
        raise ConfigError(f"length_penalty_kind={decode.length_penalty_kind!r}: CTranslate2 only has the "
                          "score / len^alpha (fairseq) penalty")
    mapped = {m.option: m.value(decode) for m in CT2_MAPPING.values() if m.option is not None and m.value is not None}
    return {**mapped, **CT2_FIXED_OPTIONS}


def max_decoding_length(decode: DecodeConfig, source_tokens: int) -> int:
    """CT2's max_decoding_length (tokens including EOS) for a source of `source_tokens` pieces
    (without EOS): our limit floor(a * (n + 1) + b) output tokens before EOS, plus the EOS."""

    return int(math.floor(decode.max_len_a * (source_tokens + 1) + decode.max_len_b)) + 1


def check_ct2_directory(root: Path, tokenizer_files: Sequence[str]) -> None:
    """CheckpointError naming the missing files of a `convert ct2` directory (its settings file aside)."""
    present = {p.name for p in root.iterdir()}
    missing = [name for name in dict.fromkeys([*MODEL_FILES, *tokenizer_files]) if name not in present]
    stems = {name.rsplit(".", 1)[0] for name in present if name.endswith((".json", ".txt"))}
    if not any(all(stem in stems for stem in option) for option in VOCABULARY_FILES):
        missing.append("shared_vocabulary.json (or source_vocabulary.json + target_vocabulary.json)")
    if missing:
        raise CheckpointError(f"{root} is an incomplete CTranslate2 directory: missing {', '.join(missing)}; "
                              "convert the checkpoint again (`multibranch convert ct2`)")


def _import_ctranslate2() -> Any:
    try:
        import ctranslate2
    except ImportError:
        raise UserError("decoding a CTranslate2 directory needs the ctranslate2 package "
                        "(pip install 'multibranch[ct2]')") from None
    return ctranslate2


class Ct2Translator:
    """Translate raw text lines with a `convert ct2` directory.

    Args:
        directory: the directory (its settings file gives the decode config and tokenizer files).
        device: "cpu", "cuda", "cuda:N" (or that torch.device).
        threads: CPU threads of CTranslate2's translator.
        overrides: fields of the stored DecodeConfig to replace (e.g. beam=4).
    """

    def __init__(self, directory: str | Path, device: str | torch.device = "cpu", threads: int = 1, **overrides: Any):
        ct2 = _import_ctranslate2()
        self.root = Path(directory)
        settings_path = self.root / CT2_SETTINGS_FILE
        if not settings_path.is_file():
            raise CheckpointError(f"{directory}: not a directory written by `multibranch convert ct2` "
                                  f"(no {CT2_SETTINGS_FILE})")
        self.settings = read_json_object(settings_path, CheckpointError, "convert the checkpoint again")
        try:
            stored = DecodeConfig(**self.settings["decode"])
            files = self.settings["tokenizer"]
            src_file, tgt_file = self.root / str(files["src"]), self.root / str(files["tgt"])
        except (KeyError, TypeError) as err:
            raise CheckpointError(f"{settings_path}: incomplete or foreign settings ({type(err).__name__}: {err}); "
                                  "convert the checkpoint again") from None
        check_ct2_directory(self.root, [src_file.name, tgt_file.name])
        for path in {src_file, tgt_file}:
            check_recorded_sha256(path, files.get("sha256") or {})
        self.cfg = dataclasses.replace(stored, **overrides)
        self.cfg.validate()
        self.options = translate_options(self.cfg)  # ConfigError now for what CT2 cannot do
        # our Tokenizer, not bare SentencePiece: a `prepare --pretokenized` word vocabulary gives one <unk> per
        # unknown word and joins `@@ ` in the output, as the checkpoint does
        self.tokenizer = Tokenizer.from_files(src_file, tgt_file)
        limits = [n for n in (self.settings.get("max_positions"), self.cfg.max_input_tokens) if n is not None]
        self.max_input_tokens: int | None = min(limits) if limits else None
        self.device = str(device)  # a torch.device reads "cpu" / "cuda:0", as CTranslate2 names them
        kind, _, index = self.device.partition(":")
        try:
            self.translator = ct2.Translator(str(self.root), device=kind, device_index=int(index or 0),
                                             inter_threads=1, intra_threads=threads)
        except (RuntimeError, ValueError) as err:
            reason = (str(err).strip().splitlines() or [""])[0]
            raise CheckpointError(f"{self.root}: CTranslate2 cannot load it ({reason})") from None
        self.stats = TranslationStats()

    def with_decode(self, **fields: Any) -> Ct2Translator:
        """This translator with `fields` replaced in its decode config, sharing the loaded CTranslate2 model;
        ConfigError for a value out of its range or a setting CTranslate2 cannot reproduce (`CT2_MAPPING`)."""
        other = copy.copy(self)
        other.cfg = dataclasses.replace(self.cfg, **fields)
        other.cfg.validate()
        other.options = translate_options(other.cfg)
        other.stats = TranslationStats()
        return other

    def translate(self, lines: list[str], progress: Progress = False, first_line: int = 1) -> list[str]:
        """One translation (the best hypothesis) per input line, in input order (`first_line`: the number of
        `lines[0]` in the messages about long lines)."""
        return [entries[0][0] for entries in self._run(lines, 1, progress, first_line=first_line)]

    def translate_nbest(self, lines: list[str], n: int, progress: Progress = False,
                        beam: int | None = None, first_line: int = 1) -> list[list[tuple[str, float]]]:
        """Up to `n` (<= beam) (text, normalised score) pairs per line, best first; `beam` replaces
        the configured beam for this call. An empty line gives [("", 0.0)]."""
        beam = beam or self.cfg.beam
        if not 1 <= n <= beam:
            raise ValueError(f"n={n} must be between 1 and beam={beam}")
        return self._run(lines, n, progress, beam, first_line)

    def check_lengths(self, lines: list[str], first_line: int = 1) -> None:
        """DataError naming the first line over the input limit when `long_inputs` is "refuse" (else nothing)."""
        if self.cfg.long_inputs == "refuse":
            self._encode(lines, first_line)

    def count_tokens(self, lines: list[str]) -> list[int]:
        """Source tokens of each line, EOS included (before truncation)."""
        return [len(ids) + 1 for ids in self.tokenizer.encode_src(lines)]

    def score(self, lines: Sequence[str], references: Sequence[str], progress: Progress = False,
              first_line: int = 1) -> list[ForcedScore | None]:
        """Forced decoding (`score_batch`): `references[i]` scored as the translation of `lines[i]`,
        EOS included, normalised with our length penalty; an empty source line gives None."""
        if len(lines) != len(references):
            raise DataError(f"line counts differ: {len(lines)} input lines but {len(references)} references")
        start = time.perf_counter()
        keep, sources = self._encode(list(lines), first_line)
        targets = self._pieces(self.tokenizer.tgt, self.tokenizer.encode_tgt([references[i] for i in keep]))
        results: list[ForcedScore | None] = [None] * len(lines)
        scored = self.translator.score_batch(sources, targets, max_batch_size=self.cfg.batch_size,
                                             max_input_length=0) if keep else []
        for i, result in zip(keep, scored, strict=True):
            total = float(sum(result.log_probs))  # target tokens + EOS
            count = len(result.log_probs)
            divisor = length_penalty(count, self.cfg.length_penalty, self.cfg.length_penalty_kind)
            results[i] = ForcedScore(total / divisor, total, count, [float(x) for x in result.log_probs])
        self._advance(progress, len(lines))
        self.stats.sentences += len(lines)
        self.stats.src_tokens += sum(len(s) + 1 for s in sources)
        self.stats.tgt_tokens += sum(len(t) + 1 for t in targets)
        self.stats.seconds += time.perf_counter() - start
        return results

    # ---- internals -------------------------------------------------------------------------------

    def _encode(self, lines: list[str], first_line: int = 1) -> tuple[list[int], list[list[str]]]:
        """(indices of non-empty lines, their source pieces without EOS, truncated to the input limit, with one
        warning naming the truncated lines; a DataError instead when `long_inputs` is "refuse")."""
        keep = [i for i, line in enumerate(lines) if line.strip()]
        pieces = self._pieces(self.tokenizer.src, self.tokenizer.encode_src([lines[i] for i in keep])) if keep else []
        limit = self.max_input_tokens
        over = long_lines([len(p) + 1 for p in pieces], limit, self.cfg.long_inputs, [first_line + i for i in keep])
        if over and limit is not None:
            self.stats.truncated += len(over)
            warn_truncated([first_line + keep[p] for p in over], limit)
            pieces = [p[: limit - 1] for p in pieces]
        return keep, pieces

    @staticmethod
    def _pieces(processor: Any, ids: list[list[int]]) -> list[list[str]]:
        """Token strings of ids, as `convert ct2` wrote the vocabulary (`convert.payload.token_strings`)."""
        return [[processor.id_to_piece(i) for i in row] for row in ids]

    def _decoding_limit(self, source_pieces: int) -> int:
        limit = max_decoding_length(self.cfg, source_pieces)
        rows = self.settings.get("max_positions")  # the decoder's position table ends there too
        return limit if rows is None else min(limit, rows)

    @staticmethod
    def _advance(progress: Progress, n: int) -> None:
        if progress is not False and progress is not True and n:
            progress.update(n)

    def _run(self, lines: list[str], nbest: int, progress: Progress = False, beam: int | None = None,
             first_line: int = 1) -> list[list[tuple[str, float]]]:
        start = time.perf_counter()
        owned = progress_bar(len(lines), True) if progress is True else None
        bar = owned if owned is not None else progress
        results: list[list[tuple[str, float]]] = [[("", 0.0)] for _ in lines]
        keep, sources = self._encode(list(lines), first_line)
        self._advance(bar, len(lines) - len(keep))
        options = {**self.options, "num_hypotheses": nbest, "beam_size": beam or self.cfg.beam}
        by_limit: dict[int, list[int]] = {}  # CT2 takes one length limit per call; ours depends on the source
        for position, pieces in enumerate(sources):
            by_limit.setdefault(self._decoding_limit(len(pieces)), []).append(position)
        tgt_tokens = 0
        for limit, group in by_limit.items():
            batch = self.translator.translate_batch([sources[p] for p in group], max_decoding_length=limit,
                                                    max_batch_size=self.cfg.batch_size, **options)
            for position, result in zip(group, batch, strict=True):
                hyps = [h[:-1] if h and h[-1] == END else h for h in result.hypotheses]
                texts = self.tokenizer.decode_tgt([[self.tokenizer.tgt.piece_to_id(p) for p in h] for h in hyps])
                results[keep[position]] = [(text, float(s)) for text, s in zip(texts, result.scores, strict=True)]
                tgt_tokens += len(result.hypotheses[0]) if result.hypotheses else 0
            self._advance(bar, len(group))
        if owned is not None:
            owned.close()
        self.stats.sentences += len(lines)
        self.stats.src_tokens += sum(len(s) + 1 for s in sources)
        self.stats.tgt_tokens += tgt_tokens
        self.stats.seconds += time.perf_counter() - start
        return results
