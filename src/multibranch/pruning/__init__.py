"""Attention-head pruning (DropHead §4.3, Michel et al. 2019): how much each head matters, what masking
the least important ones costs, and their physical removal.

- `importance`   head importance |d loss / d gate| (`head_importance`)
- `scoring`      a model's score (BLEU or accuracy %) as a function of no arguments, called once per mask
- `curve`        the pruning curve: mask the least important heads step by step (`pruning_curve`, `within_drop`)
- `dominant`     the score change of masking each single head, the dominant head per module
- `selection`    which heads `prune` removes: a fraction, a score threshold, or a JSON list
- `removal`      remove heads from a checkpoint payload (`prune_heads`), same output as masking them
- `speed`        two models timed side by side in alternating rounds
- `run`          `multibranch prune` as one call (`prune_checkpoint`); `report` its human summary
- `head_report`  `multibranch analyze heads`: importance, entropy, curve and dominant heads as a report folder

The attention sites and their gates (`analysis/heads.py`) and the analyses' batches (`analysis/batches.py`)
are the analysis room's, one floor below.
"""
