"""Why DupMAE's paper score (eq. 12) ranks badly on a fresh MLM head: statistics of the OT vector mu and zero-shot
sparse-only retrieval, raw mu vs SPLADE's log(1 + relu(mu)).

Reads a DupMAE pre-training checkpoint (default: the one `scifact_experiment.py` trains) and SciFact: all dev queries
against their positives plus `--random-docs` random abstracts. Prints the share of positive mu entries, the mean of
a text's top-k entries, and dev NDCG@10 of the sparse score sum_{i in top-k(d)} mu_q[i] mu_d[i] for both activations.

    python benchmarks/dupmae_ot_stats.py [--checkpoint out/scifact_experiment/dupmae/pretrained]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import common  # before torch: environment defaults
from common import ROOT, SCIFACT


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=str(ROOT / "out/scifact_experiment/dupmae/pretrained"))
    p.add_argument("--random-docs", type=int, default=600)
    p.add_argument("--top-k", type=int, default=384, help="entries kept per document (the paper's default)")
    p.add_argument("--max-seq-length", type=int, default=128)
    args = p.parse_args(argv)

    import torch
    from retromae.modeling.layers_dupmae import activate_ot, sparsify_top_k
    from retromae.trainers.export.sentence_transformer import build_dupmae_sentence_transformer
    from retromae.trainers.retrieval.beir import read_beir

    dev = read_beir(SCIFACT, "dev")
    qids = list(dev.queries)
    positives = {d for judged in dev.qrels.values() for d in judged}
    others = [d for d in dev.corpus if d not in positives]
    doc_ids = [d for d in dev.corpus if d in positives] + random.Random(0).sample(others, args.random_docs)
    with tempfile.TemporaryDirectory() as folder:
        model = build_dupmae_sentence_transformer(args.checkpoint, None, Path(folder) / "ot", representation="ot",
                                                  max_seq_length=args.max_seq_length)
        with torch.no_grad():  # the raw mu (ot_activation "none" is the export's default)
            mu_docs = torch.stack(list(model.encode_document(
                [dev.doc_text(d) for d in doc_ids], output_value="ot_embedding",
                convert_to_tensor=True, batch_size=32)))
            mu_queries = torch.stack(list(model.encode_query(
                [dev.queries[q] for q in qids], output_value="ot_embedding", convert_to_tensor=True, batch_size=32)))
    print(f"{len(qids)} dev queries x {len(doc_ids)} documents; checkpoint {args.checkpoint}")
    print(f"mu > 0: documents {float((mu_docs > 0).float().mean()):.3f}, queries {float((mu_queries > 0).float().mean()):.3f}; "
          f"mean of a document's top-{args.top_k}: {float(mu_docs.topk(args.top_k, dim=1).values.mean()):.2f}")
    print("| mu | sparse-only NDCG@10 | sparse term: mean | std over documents |\n|---|---|---|---|")
    for activation in ("none", "log1p_relu"):
        q, d = activate_ot(mu_queries, activation), activate_ot(mu_docs, activation)
        scores = q @ sparsify_top_k(d, args.top_k).T
        ndcg = common.run_metrics(common.ranked_run(scores, qids, doc_ids), dev.qrels)["ndcg_at_10"]
        print(f"| {activation} | {ndcg:.4f} | {float(scores.mean()):.1f} | "
              f"{float(scores.std(dim=1).mean()):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
