"""Checkpoint surgery: every function takes/returns a checkpoint payload and drops training state.

- `proximal.proximal_init`  standard Transformer -> MAT with identical branches (MAT §3.3)
- `fold.fold_mat`           MAT -> one attention of N_a*M heads, same eval output (docs/papers.md#mat-folding)
- `hf_marian.import_marian` local Hugging Face MarianMTModel directory -> standard model
- `average.average_checkpoints` / `select_checkpoints`  weight averaging of a run's checkpoints
- `ct2.export_ct2`          CTranslate2 model directory

The release directory (`export`/`load_export`) lives in `multibranch.checkpoint.export`.
"""
