"""The bottom layer of `retromae.trainers`: what every command shares. Nothing above this folder is imported here.

* `errors`: `UserError`, the one type of a problem the user can fix (printed as one line by the CLI).
* `arguments`: command-line parsing (`--config` files and presets, list flags, repeated flags), logging set-up.
* `io`: atomic file writes and JSONL readers that name the file and line of a bad record.
* `folders`: model folders (completeness checks, Hub ids and local paths) and atomic folder swaps.
* `checkpoints`: the one checkpoint loader (state dicts, tokenizers, BERT encoders, MLM heads, sentence-transformers).
* `cards`: the one model-card renderer (pre-trained and fine-tuned encoders).
* `versions`: package and library versions recorded in run records and cards.
"""
