"""Training data: reading corpora, the built-in demo corpus, tokenizing once, the pre-training collator, span and
query-passage pairs, fine-tuning groups."""
