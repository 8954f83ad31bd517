"""Checkpoints and exported models: the bottom layer that knows no task, model or experiment.

- `payload`          FORMAT/VERSION of a payload, tied-tensor groups
- `format`           the checkpoint file (atomic save, strict load, state-dict checks)
- `export`           the release directory (safetensors + config.json + tokenizer files), read back as a payload
- `tokenizer_state`  how a tokenizer is stored in a payload (plain tensors)
- `origin`           which run a checkpoint comes from (kept in its meta; averaging checks it)

Rebuilding a model from a payload is the tasks layer's job (`multibranch.loading.checkpoint.load_model`).
"""
