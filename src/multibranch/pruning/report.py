"""The `multibranch prune` report (`run.prune_checkpoint`'s dict) as a few human lines."""

from __future__ import annotations

from typing import Any


def summary(report: dict[str, Any]) -> str:
    """The report as a few human lines."""
    p = report["parameters"]
    lines = [f"removed {len(report['removed'])} head(s); parameters {p['before']:,} -> {p['after']:,} "
             f"({p['change']:+,}, {p['change_percent']:+.1f}%)"]
    if "before" in report:
        metric = "BLEU" if report["metric"] == "bleu" else "accuracy (%)"
        b, a = report["before"], report["after"]
        lines.append(f"{metric} on {report['set']['sentences']} sentences of {report['set']['split']}: "
                     f"{b['score']:.2f} -> {a['score']:.2f} ({report['score_change']:+.2f})")
    if "speed" in report:
        lines.append(speed_line(report))
    return "\n".join(lines)


def speed_line(report: dict[str, Any]) -> str:
    """Sentences/s of both models (median of the rounds, min-max) and the range of the per-round ratios;
    a range that spans x1.00 is said to be no measurable change."""
    b, a, s = report["before"], report["after"], report["speed"]
    rounds = s["rounds"]
    line = (f"speed: {b['sentences_per_s_median']:.1f} -> {a['sentences_per_s_median']:.1f} sentences/s "
            f"(median of {rounds} alternating round{'s' if rounds > 1 else ''}; "
            f"before {b['sentences_per_s_min']:.1f}-{b['sentences_per_s']:.1f}, "
            f"after {a['sentences_per_s_min']:.1f}-{a['sentences_per_s']:.1f}); "
            f"x{s['speedup_median']:.2f} (rounds x{s['speedup_min']:.2f}-x{s['speedup_max']:.2f})")
    if rounds == 1:
        return line + "; one round measures no spread: use --speed-rounds 5 or more"
    if s["speedup_min"] < 1.0 < s["speedup_max"]:
        return line + "; the rounds disagree on the direction: no measurable speed change on this machine"
    return line
