"""Loading a trained model for use: `checkpoint` rebuilds one checkpoint (model, tokenizer, config); `model` is the
`LoadedModel` that translate, classify, serve, analyze and the Python API share (a checkpoint, an ensemble, an
export or a CTranslate2 directory, with every check of what it can do)."""
