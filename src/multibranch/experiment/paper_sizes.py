"""The parameter count a paper publishes for a preset's configuration (`multibranch info --preset`).

A paper preset may carry a `paper_size` block in its own YAML file (it is not inherited by presets
that name it as their `base`):

    paper_size:
      millions: 48.19                  # the published count
      vocabulary: [8848, 6632]         # source / target types it was counted with (the paper's data)
      tolerance: 0.01                  # relative difference still accepted as the same model
      source: MUSE reference run log, IWSLT14 De-En
      note: why our count differs, when it does

`info` counts the preset at that vocabulary and prints both numbers; tests/experiment pins every preset
with a `paper_size` to its tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

from multibranch.config import ConfigError, load_yaml
from multibranch.experiment import preset_dir


@dataclass(frozen=True)
class PaperSize:
    millions: float
    src_vocab: int
    tgt_vocab: int
    tolerance: float
    source: str
    note: str = ""

    def relative_difference(self, count: int) -> float:
        """(ours - paper) / paper."""
        return count / (self.millions * 1e6) - 1.0

    def describe(self, count: int) -> str:
        """`paper 36.7M (MAT paper ...); ours 36.74M (+0.1%), within the 0.5% accepted`."""
        diff = self.relative_difference(count)
        verdict = "within" if abs(diff) <= self.tolerance else "OUTSIDE"
        text = (f"paper {self.millions:g}M ({self.source}); ours {count / 1e6:.2f}M ({diff:+.1%}), {verdict} the "
                f"{self.tolerance:.1%} accepted")
        return f"{text}; {self.note}" if self.note else text


def paper_size(preset: str) -> PaperSize | None:
    """The `paper_size` of a named preset (its own file only), or None."""
    path = preset_dir() / f"{preset}.yaml"
    if not path.exists():
        return None
    block = load_yaml(path).get("paper_size")
    if block is None:
        return None
    try:
        src_vocab, tgt_vocab = block["vocabulary"]
        return PaperSize(float(block["millions"]), int(src_vocab), int(tgt_vocab), float(block["tolerance"]),
                         str(block["source"]), str(block.get("note", "")))
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{path}: paper_size needs millions, vocabulary [src, tgt], tolerance and source ({e})") from e
