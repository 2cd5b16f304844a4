"""Export: a checkpoint's encoder as a sentence-transformers model (CLS or DupMAE hybrid), model cards, and
publishing to the Hub."""
