"""Random sampling of outputs (back-translation): `n` independent samples per sentence, batched.

Each step takes the search's distribution (pad/bos masked before the log_softmax, then the rules of
`processors.processors_for`: EOS masked before `min_len`, only EOS at the maximum length, n-gram blocking, target
prefixes) and draws the next token from

    softmax(log p / temperature), restricted to the top_k most probable tokens (0: all), then to the
    smallest set of most probable tokens whose probability reaches top_p (1.0: all), renormalised

(`processors.sampling_processors`, in the order of Hugging Face's `generate`; fairseq's
--sampling-topk/--sampling-topp are the same filters). A hypothesis' positional scores are the model's own
log-probabilities (temperature 1, no restriction: what --score-reference reports for the same output); its
score is their sum divided by the length penalty. Samples of a sentence come back best score first. A sample
whose every token is blocked (n-gram blocking with EOS masked) ends there with EOS, scored -inf.

Two engines give the same distribution (`sample` picks one by device, like `search.search`). On the CPU a
finished row leaves the batch at once, so the later steps compute only live rows. On CUDA the rows (sentence
x sample) stay in the batch for the whole search, with fixed shapes (`StaticSampler`, the buffers of
`static_decoding`): a finished row goes on being computed, its tokens stay pad and nothing it draws is
scored; a step is then a fixed sequence of kernels that a CUDA graph replays (`graphed_search`), the host
reads one boolean a step (whether every row is done) and copies the results back once. Both draw with the
exponential race, argmax(p / E) with E ~ Exp(1) per token (the distribution of a multinomial draw, with no
host read). Draws come from one `torch.Generator`, so the output is reproducible for a given seed, batch
order, engine and device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from multibranch.inference.beam import (
    Decodable,
    Hypothesis,
    _finish,
    _step_scores,
    best_first,
    new_state,
    output_limits,
)
from multibranch.inference.graphed_search import FixedShapes
from multibranch.inference.processors import (
    NEG_INF,
    ScoreProcessor,
    StepState,
    apply_processors,
    length_penalty,
    processors_for,
    sampling_processors,
)
from multibranch.inference.static_decoding import StaticDecoding

if TYPE_CHECKING:
    from multibranch.experiment.decoding import DecodeConfig


def sampling_probs(lprobs: Tensor, processors: Sequence[ScoreProcessor], state: StepState, eos_id: int) -> Tensor:
    """The search's log-probabilities [N, V] -> the unnormalised probabilities [N, V] to draw from: `processors`
    (`sampling_processors`) on a copy, exponentiated; a row whose every token is blocked (n-gram blocking with EOS
    masked) draws EOS, which it scores -inf. Dense: no host read."""
    probs = apply_processors(processors, lprobs.clone(), state).exp_()  # [N, V]
    blocked = lprobs.eq(NEG_INF).all(dim=1)  # [N] (their reshaped distribution is NaN)
    probs.masked_fill_(blocked[:, None], 0.0)
    probs[:, eos_id].masked_fill_(blocked, 1.0)
    return probs


def draw(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One token per row of probs [N, V] (unnormalised, >= 0, some > 0 per row) -> [N] long, token i with
    probability probs[i] / sum(probs): the exponential race argmax(probs / E), E = -log U ~ Exp(1) i.i.d."""
    noise = torch.empty_like(probs).uniform_(generator=generator).log_().neg_()  # [N, V] in (0, inf]: no 0 / 0
    return (probs / noise).argmax(dim=-1)


class StaticSampler(StaticDecoding):
    """`n` samples per sentence in fixed buffers, for batches of up to `rows` sentences of up to `src_len` tokens:
    `load(src)` puts a batch in, `step()` draws one token per row (no host read, no allocation that outlives it),
    `all_done()` is the one read a step, `results()` copies back once (per sentence, its samples in row order).
    Draws come from `generator` (None: the default one of the device)."""

    kind = "sampling"

    def __init__(self, model: Decodable, rows: int, src_len: int, options: DecodeConfig, n: int, *,
                 generator: torch.Generator | None = None, prefixed: bool = False,
                 device: torch.device | str = "cpu") -> None:
        if n < 1:
            raise ValueError(f"n={n} samples per sentence must be >= 1")
        self.sampling = sampling_processors(options)
        super().__init__(model, rows, src_len, options, n, prefixed=prefixed, device=device)
        self.n, self.generator = n, generator

    def _allocate_search(self) -> None:
        N = self.B * self.n
        self.ended = torch.zeros(N, dtype=torch.bool, device=self.device)  # [N] row has drawn EOS (fillers: True)
        self.length = torch.zeros(N, dtype=torch.long, device=self.device)  # [N] output tokens incl. EOS

    def _reset_search(self, loaded: int) -> None:
        self.ended.zero_()
        self.ended[loaded * self.n :] = True
        self.length.zero_()

    def step(self) -> None:
        """One token for every row, in place; a row that draws EOS has ended (its later steps record nothing)."""
        N, step = self.B * self.n, self.position
        lprobs = self.step_scores()  # [N, V] the model's (masked) log-probabilities
        probs = sampling_probs(lprobs, self.sampling, self.step_state, self.eos)  # [N, V]
        drawn = draw(probs, self.generator).masked_fill(self.ended, self.pad)  # [N]
        lprob = lprobs.gather(1, drawn[:, None]).masked_fill(self.ended[:, None], 0.0)  # [N, 1]
        self.tokens.scatter_(1, (step + 1).expand(N, 1), drawn[:, None])
        self.positional.scatter_(1, step.expand(N, 1), lprob)
        finishing = drawn.eq(self.eos) & ~self.ended  # [N]
        self.length.copy_(torch.where(finishing, step + 1, self.length))
        self.ended |= finishing
        self.position += 1

    def all_done(self) -> bool:
        """Whether every row has ended (the one host read of a step)."""
        return bool(self.ended.all())

    def results(self) -> list[list[Hypothesis]]:
        """Per sentence of the batch, its `n` samples in row order (one copy back)."""
        rows, n = self.loaded * self.n, self.n
        length = self.length[:rows]  # [rows]
        divisor = length_penalty(length, self.options.length_penalty, self.options.length_penalty_kind)
        scores = (self.positional[:rows].double().sum(dim=1) / divisor).tolist()
        lengths, tokens = length.tolist(), self.tokens[:rows, 1:].tolist()
        positional = self.positional[:rows].tolist()
        return [[Hypothesis(tokens[r][: lengths[r] - 1], scores[r], positional[r][: lengths[r]])
                 for r in range(s * n, (s + 1) * n)] for s in range(self.loaded)]


class FixedShapeSampler(FixedShapes):
    """The sampler of one model, drawing from `generator`, with its buffers (and on CUDA its graphs) kept per shape
    bucket across batches (see graphed_search.FixedShapes)."""

    @torch.inference_mode()
    def sample(self, src: Tensor, options: DecodeConfig, n: int = 1,
               prefix: Tensor | None = None) -> list[list[Hypothesis]]:
        """`n` samples per sentence of src [B, S], in row order."""
        options = dataclasses.replace(options)  # a copy: the bucket keeps it
        return self._run(src, prefix, (n, *dataclasses.astuple(options)), lambda rows, src_len: StaticSampler(
            self.model, rows, src_len, options, n, generator=self.generator, prefixed=prefix is not None,
            device=src.device))


def sample(model: Decodable, src: Tensor, options: DecodeConfig, n: int = 1, *,
           generator: torch.Generator | None = None, prefix: Tensor | None = None,
           sampler: FixedShapeSampler | None = None, fixed_shapes: bool | None = None) -> list[list[Hypothesis]]:
    """`n` samples for each sentence of src [B, S] (right-padded), best score first, drawn as `options` says
    (temperature, top_k, top_p, length penalty and limits, min length, n-gram blocking).

    `fixed_shapes` (default: on CUDA, or when a `sampler` is given) draws on fixed rows (`StaticSampler`);
    otherwise finished rows leave the batch, which is faster on the CPU when outputs differ in length.
    `sampler` (drawing from its own generator, which `generator` must then be or leave out) keeps buffers and
    CUDA graphs for later batches; without one, the buffers take this batch's shape."""
    if n < 1:
        raise ValueError(f"n={n} samples per sentence must be >= 1")
    if not (fixed_shapes if fixed_shapes is not None else (src.is_cuda or sampler is not None)):
        return _sample_shrinking(model, src, options, n, generator, prefix)
    if sampler is None:
        sampler = FixedShapeSampler(model, generator=generator, bucketed=False)
    elif generator is not None and generator is not sampler.generator:
        raise ValueError("the sampler draws from its own generator: pass that one, or none")
    return best_first(sampler.sample(src, options, n, prefix), None)


@torch.inference_mode()
def _sample_shrinking(model: Decodable, src: Tensor, options: DecodeConfig, n: int,
                      generator: torch.Generator | None, prefix: Tensor | None) -> list[list[Hypothesis]]:
    """The CPU's sampler: rows leave the batch as they finish (each later step computes only live rows)."""
    sampling = sampling_processors(options)
    cfg = model.config
    B = src.shape[0]
    device = src.device
    max_lens, steps = output_limits(model, src, options, prefix)  # [B], decoding steps
    rows = torch.arange(B, device=device).repeat_interleave(n)  # [B*n] sentence of each row
    enc = model.encode(src).index_select(rows)  # one encoder row per sample: rows finish independently
    max_lens = max_lens[rows]
    prefix = None if prefix is None else prefix[rows]
    state = new_state(model)
    N = B * n
    tokens = torch.full((N, steps + 1), cfg.pad_id, dtype=torch.long, device=device)  # [N, 1 + T]
    tokens[:, 0] = cfg.bos_id
    positional = torch.zeros(N, steps, device=device)  # [N, T] the model's log-prob of each token
    alive = torch.arange(N, device=device)  # original row of each live sample
    hyps: list[list[Hypothesis]] = [[] for _ in range(B)]
    processors = processors_for(options, cfg.eos_id, cfg.pad_id, prefixed=prefix is not None)
    for step in range(steps):
        step_state = StepState(step, tokens, max_lens, None if prefix is None else prefix[alive])
        lprobs, _ = _step_scores(model, enc, state, processors, step_state)  # [b, V] (not deferred: offset None)
        drawn = draw(sampling_probs(lprobs, sampling, step_state, cfg.eos_id), generator)  # [b]
        positional[:, step] = lprobs.gather(1, drawn[:, None]).squeeze(1)
        tokens[:, step + 1] = drawn
        ended = drawn.eq(cfg.eos_id)  # [b]
        if ended.any():
            done = ended.nonzero().squeeze(1)
            length = step + 1  # output tokens including the EOS
            _finish(hyps, (alive[done] // n).tolist(), tokens[done, 1:length], positional[done, :length],
                    positional[done, :length].sum(dim=1).tolist(), length, options, n)
            keep = (~ended).nonzero().squeeze(1)  # [b']
            if keep.numel() == 0:
                break
            enc = enc.index_select(keep)
            state.reorder(keep)
            tokens, positional, alive, max_lens = tokens[keep], positional[keep], alive[keep], max_lens[keep]
    return best_first(hyps, None)

