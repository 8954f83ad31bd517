"""Attention maps of chosen sentences (the attention dispersion of MUSE §1, Fig. 1): the probabilities every
attention module sees, captured with its `attention_probe` during one teacher-forced forward.

A sentence is (source ids, target ids): a split example with its reference, or raw source text with
the model's own translation as target. Maps are [queries, keys] per head; a MAT branch's map is the
mean of its M heads (head h belongs to branch h // M).

    maps = capture_maps(model, src_ids, tgt_ids)      # site name -> [H', L, S] CPU fp32
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from multibranch.analysis.batches import check_vocabulary
from multibranch.analysis.heads import ROLES, AttentionSite, attention_sites
from multibranch.figures import plots
from multibranch.figures.report import ReportFolder
from multibranch.loading.checkpoint import load_model
from multibranch.tasks.translation.dataset import PreparedData
from multibranch.tasks.translation.translator import Translator

# the report's files beside index.md: in a folder of other files, ReportFolder.check refuses them up front
REPORT_FILES = ("attention.json", "attention_s*.png")


class SelectionError(ValueError):
    """The chosen sentences, heads, branch or layers do not exist."""


@torch.no_grad()
def capture_maps(model: nn.Module, src_ids: list[int], tgt_ids: list[int],
                 sites: list[AttentionSite] | None = None) -> dict[str, Tensor]:
    """Probabilities [H', L, S] of every site for one sentence (EOS appended to the source, BOS
    prepended to the decoder input), model in eval mode."""
    cfg = model.config
    sites = attention_sites(model) if sites is None else sites
    device = next(model.parameters()).device
    src = torch.tensor([[*src_ids, cfg.eos_id]], device=device)  # [1, S]
    prev = torch.tensor([[cfg.bos_id, *tgt_ids]], device=device)  # [1, T]
    captured: dict[str, Tensor] = {}

    def probe_for(name: str):
        def probe(probs: Tensor) -> None:  # [1, H', L, S]
            captured[name] = probs[0].float().cpu()
        return probe

    was_training = model.training
    model.eval()
    try:
        for site in sites:
            site.module.attention_probe = probe_for(site.name)
        model(src, prev, features_only=True)
    finally:
        for site in sites:
            site.module.attention_probe = None
        model.train(was_training)
    return captured


def branch_heads(site: AttentionSite) -> int:
    """Heads per branch M of a site (all heads for a one-branch module)."""
    return int(getattr(site.module, "heads", site.heads)) if getattr(site.module, "branches", 1) > 1 else site.heads


@dataclass
class Selection:
    """What to draw: attention types, layers (None = all), heads (None = all) or one MAT branch."""

    roles: tuple[str, ...] = ROLES
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    branch: int | None = None


def select_maps(sites: list[AttentionSite], maps: dict[str, Tensor], selection: Selection) -> list[dict[str, Any]]:
    """[{"name", "role", "layer", "panels": [(title, [L, S] tensor)]}] for the selected sites."""
    out = []
    for site in sites:
        if site.role not in selection.roles or (selection.layers is not None and site.layer not in selection.layers):
            continue
        probs = maps[site.name]  # [H', L, S]
        probs = probs.view(-1, site.heads, *probs.shape[1:]).mean(0)  # [H, L, S] (copies of shared weights averaged)
        if selection.branch is not None:
            m = branch_heads(site)
            branches = site.heads // m
            if not 0 <= selection.branch < branches:
                raise SelectionError(f"{site.name} has {branches} branch(es); no branch {selection.branch}")
            panels = [(f"branch {selection.branch}", probs[selection.branch * m:(selection.branch + 1) * m].mean(0))]
        else:
            heads = range(site.heads) if selection.heads is None else selection.heads
            bad = [h for h in heads if not 0 <= h < site.heads]
            if bad:
                raise SelectionError(f"{site.name} has {site.heads} heads; no head {bad[0]}")
            panels = [(f"head {h}", probs[h]) for h in heads]
        out.append({"name": site.name, "role": site.role, "layer": site.layer, "panels": panels})
    return out


def pieces(processor: Any, ids: list[int]) -> list[str]:
    return [processor.id_to_piece(int(i)) for i in ids]


def map_axes(role: str, source: list[str], target: list[str]) -> tuple[list[str], list[str]]:
    """(query tokens, key tokens) of a map of attention type `role`, from the source tokens (EOS
    included) and the decoder input tokens (BOS included)."""
    queries = source if role == "encoder_self" else target
    keys = target if role == "decoder_self" else source
    return queries, keys


def analyze_attention(ckpt: str, out: str, *, data_dir: str | None = None, split: str = "valid",
                      indices: list[int] | None = None, texts: list[str] | None = None,
                      selection: Selection | None = None, beam: int | None = None, force: bool = False) -> Any:
    """Maps for split examples `indices` (reference targets) and/or raw source `texts` (the model's
    translation as target); writes attention.json, one PNG per sentence and module, and index.md."""


    ReportFolder.check(out, force, REPORT_FILES)
    selection = selection or Selection()
    loaded = load_model(ckpt, "cpu", task="translation")
    model, tokenizer = loaded.model, loaded.tokenizer
    sentences: list[dict[str, Any]] = []
    data = None
    if data_dir is not None:

        data = PreparedData.load(data_dir)
        check_vocabulary(data, loaded.config.model, ckpt)
        tokenizer = tokenizer or data.tokenizer()
    if indices:
        if data is None:
            raise SelectionError("--sentences needs --data (the prepared data directory)")
        chosen = data.split(split)
        for i in indices:
            if not 0 <= i < len(chosen):
                raise SelectionError(f"sentence index {i} is outside split {split!r} (0..{len(chosen) - 1})")
            sentences.append({"sentence": f"{split}:{i}", "src": chosen.src(i).tolist(), "tgt": chosen.tgt(i).tolist()})
    if texts:
        if tokenizer is None:
            raise SelectionError(f"{ckpt} carries no tokenizer: pass --data to use the data's tokenizer")

        decode = loaded.config.decode if beam is None else dataclasses.replace(loaded.config.decode, beam=beam)
        hypotheses = Translator(model, tokenizer, decode, "cpu").translate(texts)
        for text, src, tgt in zip(texts, tokenizer.encode_src(texts), tokenizer.encode_tgt(hypotheses), strict=True):
            sentences.append({"sentence": text, "src": src, "tgt": tgt})
    if not sentences:
        raise SelectionError("choose sentences with --sentences (indices into --split) or --text")
    if tokenizer is None:
        raise SelectionError(f"{ckpt} carries no tokenizer: pass --data to use the data's tokenizer")
    sites = attention_sites(model)
    report: dict[str, Any] = {"checkpoint": ckpt, "selection": dataclasses.asdict(selection), "sentences": []}
    for sentence in sentences:
        selected = select_maps(sites, capture_maps(model, sentence["src"], sentence["tgt"], sites), selection)
        source = [*pieces(tokenizer.src, sentence["src"]), "</s>"]
        target = ["<s>", *pieces(tokenizer.tgt, sentence["tgt"])]
        report["sentences"].append({"sentence": sentence["sentence"], "source_tokens": source, "target_tokens": target,
                                    "modules": selected})
    return write_report(report, out, force)


def write_report(report: dict[str, Any], out: str, force: bool) -> Any:
    folder = ReportFolder.create(out, force, REPORT_FILES)
    lines = [f"# Attention maps of `{report['checkpoint']}`", "", "Numbers: [attention.json](attention.json).", ""]
    for i, sentence in enumerate(report["sentences"]):
        lines += [f"## Sentence {i}: `{sentence['sentence']}`", ""]
        for module in sentence["modules"]:
            queries, keys = map_axes(module["role"], sentence["source_tokens"], sentence["target_tokens"])
            name = f"attention_s{i}_{module['role']}_{module['layer']}.png"
            folder.write_png(name, plots.attention_map_plot(module["panels"], queries, keys,
                                                             f"{module['name']} (sentence {i})"))
            lines += [f"![{module['name']}]({name})", ""]
            module["panels"] = [{"title": title, "map": probs.tolist()} for title, probs in module["panels"]]
    folder.write_json("attention.json", report)
    folder.write_text("index.md", "\n".join(lines))
    return folder
