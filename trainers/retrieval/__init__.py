"""Retrieval: BEIR folders, ranking metrics, hard-negative mining, MTEB evaluation, input-token coverage, and the
exact DupMAE hybrid index."""
