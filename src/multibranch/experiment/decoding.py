"""Decoding settings (a preset carries the ones its paper used)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from multibranch.config import ConfigError, bounded, check_fields


@dataclass
class DecodeConfig:
    """Beam search / greedy decoding (fairseq semantics; beam = 1 is greedy).

    length_penalty_kind: "fairseq" (score / len^alpha) or "gnmt" (score / ((5 + len) / 6)^alpha),
      alpha = length_penalty; len counts the output tokens *including* EOS (as fairseq does).
    Maximum output length (tokens before EOS): floor(max_len_a * source_length + max_len_b), where
      source_length counts the source tokens including its EOS; capped at the model's max_positions - 1
      (every kind of positions). EOS is forbidden before min_len output tokens.
    nbest: hypotheses returned per sentence (<= beam).
    no_repeat_ngram_size: n > 0 forbids any output n-gram from occurring twice in a hypothesis
      (fairseq's --no-repeat-ngram-size); 0 (default) allows repeats.
    batch_tokens: padded source tokens x beam per translation batch (longest-first batching);
      batch_size: sentences per batch.
    max_input_tokens: source tokens (including EOS) a line may have (None: only the model's limit,
      `max_positions`, applies). long_inputs: what happens to a longer line: "truncate" (to its first tokens,
      with one warning naming the line) or "refuse" (a DataError naming the line, before any is decoded).
    sampling: draw `nbest` outputs per sentence at random instead of searching (beam is then unused
      and nbest is not bounded by it): each step samples from softmax(logits / temperature) restricted
      to the top_k most probable tokens (0: all) and then to the smallest set whose probability
      reaches top_p (1.0: all), renormalised. seed: the generator's seed (None: a random one).
    fixed_shapes: which engine searches (or samples). "on": every batch keeps its rows until all its sentences
      are done, in buffers of fixed shape that a GPU replays as one CUDA graph a step (on a CPU the same steps
      run eagerly); "off": finished sentences leave the batch (the faster engine on a CPU); "auto": on on CUDA,
      off on a CPU. Both find the same hypotheses (docs/decoding.md).
    """

    beam: int = bounded(5, ge=1, note="1: greedy")
    length_penalty: float = bounded(1.0, ge=-10, le=10, note="0: none; above 1 favours longer outputs")
    length_penalty_kind: Literal["fairseq", "gnmt"] = "fairseq"
    max_len_a: float = bounded(1.2, ge=0)
    max_len_b: int = bounded(10, ge=0)
    min_len: int = bounded(1, ge=0)
    nbest: int = bounded(1, ge=1)
    batch_tokens: int = bounded(4096, ge=1)
    batch_size: int = bounded(128, ge=1)
    max_input_tokens: int | None = bounded(None, ge=2, note="one token plus EOS")
    long_inputs: Literal["truncate", "refuse"] = "truncate"
    no_repeat_ngram_size: int = bounded(0, ge=0, note="0: allow repeats")
    sampling: bool = False
    temperature: float = bounded(1.0, ge=0.001, le=1000,
                                 note="1: the model's distribution; lower: sharper, higher: flatter")
    top_k: int = bounded(0, ge=0, note="0: no top-k restriction")
    top_p: float = bounded(1.0, gt=0, le=1, note="1: no nucleus restriction")
    seed: int | None = bounded(None, ge=0, le=2**64 - 1)
    fixed_shapes: Literal["auto", "on", "off"] = "auto"

    def validate(self) -> None:
        check_fields(self)
        if not self.sampling and self.nbest > self.beam:  # samples are not bounded by the beam
            raise ConfigError(f"nbest={self.nbest} must be between 1 and beam={self.beam}")
        if self.max_len_a == 0 and self.max_len_b == 0:
            raise ConfigError("max_len_a=0 and max_len_b=0 leave no room for any output token; raise either")


SAMPLING_ONLY = ("temperature", "top_k", "top_p", "seed")  # the fields that only sampling reads


@dataclass(frozen=True)
class DecodeOption:
    """How a DecodeConfig field is offered to users: `flag`, its `multibranch translate` option (the API and serve
    take the field's own name), and `per_request`: whether one call may set it (a request to `serve`, a call of
    the Python API) or only a whole run (batching, input limits, the engine)."""

    flag: str
    per_request: bool = True


# every field of DecodeConfig -> its option (tests keep the three in step: the fields, this table and translate's
# options): a new decoding setting is its field, its entry here, its score processor (inference/processors.py) and
# its CTranslate2 mapping (tasks/translation/ct2.py); serve's requests and the API's calls take it from here
DECODE_OPTIONS: dict[str, DecodeOption] = {
    "beam": DecodeOption("--beam"),
    "length_penalty": DecodeOption("--lenpen"),
    "length_penalty_kind": DecodeOption("--lenpen-kind"),
    "max_len_a": DecodeOption("--max-len-a"),
    "max_len_b": DecodeOption("--max-len-b"),
    "min_len": DecodeOption("--min-len"),
    "nbest": DecodeOption("--nbest"),
    "batch_tokens": DecodeOption("--batch-tokens", per_request=False),
    "batch_size": DecodeOption("--batch-size", per_request=False),
    "max_input_tokens": DecodeOption("--max-input-tokens", per_request=False),
    "long_inputs": DecodeOption("--long-inputs", per_request=False),
    "no_repeat_ngram_size": DecodeOption("--no-repeat-ngram-size"),
    "sampling": DecodeOption("--sampling"),
    "temperature": DecodeOption("--temperature"),
    "top_k": DecodeOption("--top-k"),
    "top_p": DecodeOption("--top-p"),
    "seed": DecodeOption("--seed"),
    "fixed_shapes": DecodeOption("--fixed-shapes", per_request=False),
}
REQUEST_FIELDS = tuple(name for name, option in DECODE_OPTIONS.items() if option.per_request)


def check_sampling_only(given: Sequence[str], sampling: bool, switch: str = "sampling") -> None:
    """ConfigError when options of SAMPLING_ONLY are `given` (as the caller names them: `--top-k`,
    `"top_k"`) without sampling; `switch` is how the caller turns sampling on (`--sampling`)."""
    if given and not sampling:
        one = len(given) == 1
        raise ConfigError(f"{', '.join(given)} {'applies' if one else 'apply'} only to {switch}; add {switch} or "
                          f"drop {'it' if one else 'them'}")
