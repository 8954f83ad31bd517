"""Checkpoints and exported models: the bottom layer under train/, convert/, inference/ and commands/.

- `format`  the checkpoint file (FORMAT/VERSION, save/load, CheckpointError, state-dict checks)
- `origin`  which run a checkpoint comes from (kept in its meta; averaging checks it)
- `export`  the release directory (safetensors + config.json + SentencePiece), read back as a payload
- `model`   `load_model`: rebuild the model, tokenizer and config of a checkpoint or export

Nothing here imports `multibranch.train`, `multibranch.convert` or `multibranch.commands`.
"""
