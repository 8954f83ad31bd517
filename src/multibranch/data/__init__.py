"""Data: reading and checking raw text, SentencePiece, binarised datasets, token batching."""
