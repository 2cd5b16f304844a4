"""An exact index for DupMAE's hybrid representation: dense [CLS] part in faiss, sparse OT part as a CSR matrix.

Each document is stored as its dense vector W^cls h_d (`dense_dim` float32) plus its top-k OT entries (`doc_top_k`
pairs of int32 vocabulary id + float32 weight). A query is scored against every document with the paper's eq. 12,

    score(q, d) = h_q . h_d + sum_{i in top-k(d)} mu_q[i] * mu_d[i],

where the query keeps its full mu (or its `query_top_k` entries). The sparse part is `D_csr @ q` (scipy), the dense
part a matrix product with the faiss-held vectors, both in blocks of documents, so nothing of size
queries x documents x vocabulary is ever formed.

- ``index_type="flat"`` (default): exact top-n over all documents.
- ``"hnsw"`` / ``"ivf"``: the dense part is searched approximately (faiss HNSW / IVF-Flat, inner product); the
  candidates are the dense top-`candidates` united with the exact sparse top-`candidates`, and every candidate is
  rescored exactly. Results are exact for the candidates, not guaranteed over the whole corpus.

Typical use::

    model = load_dupmae_sentence_transformer("out/dupmae-st")
    index = HybridIndex.build(model, texts, ids, batch_size=64)
    index.save("out/index")
    index = HybridIndex.load("out/index")
    hits = index.search_texts(model, ["what is dense retrieval?"], top_n=10)  # [[(doc_id, score), ...]]
Saved folder: see `index_files`."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import scipy.sparse as sp

from ..inputs.errors import one_line_message
from ..inputs.outputs import atomic_folder
from .hybrid_parts import (
    HybridIndexBase,
    document_parts,
    dupmae_pooling,
    model_fingerprint,
    top_columns,
)
from .index_files import (
    DENSE_FILE,
    IDS_FILE,
    MANIFEST,
    SPARSE_FILES,
    claim_index_folder,
    read_manifest,
    write_manifest,
)

logger = logging.getLogger(__name__)
INDEX_TYPES = ("flat", "hnsw", "ivf")
SCORE_BLOCK = 1 << 23  # query x document scores per block (32 MiB of float32)


class HybridIndex(HybridIndexBase):
    """Dense (faiss) + sparse (CSR, documents x vocabulary) index scoring with DupMAE's eq. 12.

    Args:
        dense_dim: d' of the dense part; None when the representation has none (``representation="ot"``).
        vocab_size: |V|, the width of the sparse part.
        doc_top_k: k, OT entries stored per document (1..vocab_size); None when the representation has no sparse
            part (``representation="cls"``).
        index_type: ``"flat"`` (exact), ``"hnsw"`` or ``"ivf"`` (approximate dense candidates, exact rescoring).
        model_fingerprint: `model_fingerprint(model)` of the encoding model; queries from another model are refused.
        hnsw_m / hnsw_ef_construction / hnsw_ef_search: HNSW graph degree and beam widths.
        ivf_nlist / ivf_nprobe: IVF lists (default ~4 sqrt(N), trained at the first search or save) and lists probed.
        candidates: dense and sparse candidates per query for the approximate types (default 10 x top_n, >= 100).
    """

    def __init__(self, dense_dim: int | None, vocab_size: int, doc_top_k: int | None, *, index_type: str = "flat",
                 model_fingerprint: str | None = None, hnsw_m: int = 32, hnsw_ef_construction: int = 80,
                 hnsw_ef_search: int = 128, ivf_nlist: int | None = None, ivf_nprobe: int = 16,
                 candidates: int | None = None):
        if index_type not in INDEX_TYPES:
            raise ValueError(f"index_type={index_type!r} is not supported; choose one of {', '.join(INDEX_TYPES)}")
        super().__init__(dense_dim, vocab_size, doc_top_k, model_fingerprint=model_fingerprint, candidates=candidates)
        self.index_type = index_type
        self.params = {"hnsw_m": hnsw_m, "hnsw_ef_construction": hnsw_ef_construction, "hnsw_ef_search": hnsw_ef_search,
                       "ivf_nlist": ivf_nlist, "ivf_nprobe": ivf_nprobe, "candidates": candidates}
        self._dense: faiss.Index | None = None
        self._pending_dense: list[np.ndarray] = []  # IVF: vectors waiting for training
        self._sparse: sp.csr_matrix | None = None
        self._pending_sparse: list[tuple[np.ndarray, np.ndarray]] = []
        if dense_dim is not None and index_type != "ivf":
            self._dense = self._new_dense_index()

    # ---- construction ----------------------------------------------------------------------------------------------

    def _new_dense_index(self, num_train: int = 0) -> faiss.Index:
        d = self.dense_dim
        if self.index_type == "flat":
            return faiss.IndexFlatIP(d)
        if self.index_type == "hnsw":
            index = faiss.IndexHNSWFlat(d, self.params["hnsw_m"], faiss.METRIC_INNER_PRODUCT)  # default metric is L2
            index.hnsw.efConstruction = self.params["hnsw_ef_construction"]
            index.hnsw.efSearch = self.params["hnsw_ef_search"]
            return index
        nlist = self.params["ivf_nlist"] or max(1, min(int(4 * num_train**0.5), num_train // 39))
        self.params["ivf_nlist"] = nlist
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.nprobe = min(self.params["ivf_nprobe"], nlist)
        return index

    def add(
        self,
        ids: Sequence[str],
        dense: Any = None,
        sparse_indices: Any = None,
        sparse_values: Any = None,
    ) -> None:
        """Add documents.

        Args:
            ids: one id per document (unique over the index).
            dense: `(n, dense_dim)` dense parts.
            sparse_indices: `(n, doc_top_k)` vocabulary ids of each document's top-k OT entries.
            sparse_values: `(n, doc_top_k)` their weights mu_d[i].
        """
        new_ids, dense, idx, val = self._check_documents(ids, dense, sparse_indices, sparse_values)
        if not new_ids:
            return
        if self.dense_dim is not None:
            if self._dense is None:
                self._pending_dense.append(dense)
            else:
                self._dense.add(dense)
        if self.doc_top_k is not None:
            order = np.argsort(idx, axis=1)  # CSR rows with sorted column ids
            self._pending_sparse.append(
                (np.take_along_axis(idx, order, 1).astype(np.int32), np.take_along_axis(val, order, 1))
            )
        self.ids.extend(new_ids)

    def _finalize(self) -> None:
        """Train/fill a pending IVF index and merge pending sparse rows into the CSR matrix."""
        if self._pending_dense:
            vectors = np.concatenate(self._pending_dense)
            self._pending_dense = []
            self._dense = self._new_dense_index(num_train=len(vectors))
            self._dense.train(vectors)
            self._dense.make_direct_map()  # reconstruct() for exact rescoring; kept up to date by add()
            self._dense.add(vectors)
        if self._pending_sparse:
            k = self.doc_top_k
            indices = np.concatenate([i.reshape(-1) for i, _ in self._pending_sparse])  # (rows * k,)
            data = np.concatenate([v.reshape(-1) for _, v in self._pending_sparse])
            self._pending_sparse = []
            rows = len(indices) // k
            block = sp.csr_matrix(
                (data, indices, np.arange(0, rows * k + 1, k, dtype=np.int64)), shape=(rows, self.vocab_size)
            )
            self._sparse = block if self._sparse is None else sp.vstack([self._sparse, block], format="csr")
        if self._sparse is None and self.doc_top_k is not None:
            self._sparse = sp.csr_matrix((0, self.vocab_size), dtype=np.float32)

    @classmethod
    def build(
        cls,
        model: Any,
        texts: Sequence[str],
        ids: Sequence[str] | None = None,
        batch_size: int = 32,
        *,
        index_type: str = "flat",
        encode_chunk: int = 256,
        show_progress_bar: bool = False,
        **index_kwargs: Any,
    ) -> HybridIndex:
        """Encode `texts` as documents with a DupMAE SentenceTransformer and index them.

        Args:
            model: a SentenceTransformer whose last module is `DupMAEPooling`
                (`retromae.trainers.export.dupmae.load_dupmae_sentence_transformer`).
            texts: the documents.
            ids: their ids (default "0", "1", ...).
            batch_size: encoding batch size.
            index_type / **index_kwargs: see the class.
            encode_chunk: texts per `encode_document` call (bounds the memory of the per-text outputs).
        """
        ids = [str(i) for i in range(len(texts))] if ids is None else [str(i) for i in ids]
        if len(ids) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(ids)} ids")
        pooling = dupmae_pooling(model)
        index = cls(
            dense_dim=pooling.get_config_dict()["dense_dim"] if pooling.has_dense else None,
            vocab_size=pooling.vocab_size,
            doc_top_k=pooling.doc_top_k if pooling.has_sparse else None,
            index_type=index_type,
            model_fingerprint=model_fingerprint(model),
            **index_kwargs,
        )
        for start in range(0, len(texts), encode_chunk):
            chunk = list(texts[start : start + encode_chunk])
            outputs = model.encode_document(
                chunk, batch_size=batch_size, output_value=None, show_progress_bar=show_progress_bar
            )
            index.add(ids[start : start + len(chunk)], **document_parts(outputs, pooling))
            logger.info("indexed %d / %d documents", start + len(chunk), len(texts))
        index._finalize()
        return index

    # ---- search ----------------------------------------------------------------------------------------------------

    def search(
        self,
        query_dense: Any = None,
        query_sparse: Any = None,
        top_n: int = 10,
        *,
        model_fingerprint: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-n documents per query by eq. 12.

        Args:
            query_dense: `(num_queries, dense_dim)` dense parts.
            query_sparse: `(num_queries, vocab_size)` OT vectors, dense (numpy / torch) or scipy sparse.
            top_n: results per query (capped at the number of documents).
            model_fingerprint: if given, must equal the index's (else `ValueError`).

        Returns:
            `(scores, positions)`, each `(num_queries, min(top_n, num_documents))`, best first; `positions` index
            `self.ids`.
        """
        self.check_fingerprint(model_fingerprint)
        if top_n < 1:
            raise ValueError(f"top_n={top_n} must be >= 1")
        self._finalize()
        q_dense, q_sparse, num_queries = self._check_queries(query_dense, query_sparse)
        n = min(top_n, len(self))
        if num_queries == 0 or n == 0:
            return np.zeros((num_queries, n), np.float32), np.zeros((num_queries, n), np.int64)
        if self.index_type == "flat" or self._dense is None:
            return self._search_exact(q_dense, q_sparse, n)
        return self._search_candidates(q_dense, q_sparse, n)

    def _dense_matrix(self) -> np.ndarray:
        """The flat index's vectors as a zero-copy `(N, dense_dim)` view."""
        n, d = self._dense.ntotal, self.dense_dim
        return faiss.rev_swig_ptr(self._dense.get_xb(), n * d).reshape(n, d)

    def _sparse_scores(self, q_sparse: Any, rows: slice | np.ndarray) -> np.ndarray:
        """`(num_queries, len(rows))` sum_i mu_q[i] mu_d[i] over each document's stored entries."""
        docs = self._sparse[rows]  # (n_docs, V) CSR
        scores = docs @ q_sparse.T  # (n_docs, Q)
        return np.asarray(scores.toarray() if sp.issparse(scores) else scores, dtype=np.float32).T

    def _search_exact(self, q_dense, q_sparse, n: int) -> tuple[np.ndarray, np.ndarray]:
        num_queries, num_docs = (q_dense if q_dense is not None else q_sparse).shape[0], len(self)
        xb = self._dense_matrix() if q_dense is not None else None
        block = max(n, SCORE_BLOCK // num_queries)
        best_scores = np.full((num_queries, 0), -np.inf, np.float32)
        best_pos = np.zeros((num_queries, 0), np.int64)
        for start in range(0, num_docs, block):
            stop = min(start + block, num_docs)
            scores = np.zeros((num_queries, stop - start), np.float32)
            if q_dense is not None:
                scores += q_dense @ xb[start:stop].T
            if q_sparse is not None:
                scores += self._sparse_scores(q_sparse, slice(start, stop))
            scores = np.concatenate([best_scores, scores], axis=1)
            positions = np.concatenate(
                [best_pos, np.broadcast_to(np.arange(start, stop), (num_queries, stop - start))], 1
            )
            keep = top_columns(scores, n)
            best_scores = np.take_along_axis(scores, keep, 1)
            best_pos = np.take_along_axis(positions, keep, 1)
        return best_scores, best_pos

    def _search_candidates(self, q_dense, q_sparse, n: int) -> tuple[np.ndarray, np.ndarray]:
        num_queries, num_docs = q_dense.shape[0], len(self)
        c = min(num_docs, self.params["candidates"] or max(10 * n, 100))
        _, dense_candidates = self._dense.search(q_dense, c)  # (Q, c), -1 where fewer
        sparse_candidates = np.zeros((num_queries, 0), np.int64)
        if q_sparse is not None:  # exact sparse top-c, in blocks of documents
            block = max(c, SCORE_BLOCK // num_queries)
            best = np.full((num_queries, 0), -np.inf, np.float32)
            for start in range(0, num_docs, block):
                stop = min(start + block, num_docs)
                scores = np.concatenate([best, self._sparse_scores(q_sparse, slice(start, stop))], axis=1)
                positions = np.concatenate(
                    [sparse_candidates, np.broadcast_to(np.arange(start, stop), (num_queries, stop - start))], 1
                )
                keep = top_columns(scores, c)
                best, sparse_candidates = np.take_along_axis(scores, keep, 1), np.take_along_axis(positions, keep, 1)
        out_scores = np.full((num_queries, n), -np.inf, np.float32)
        out_pos = np.zeros((num_queries, n), np.int64)
        for q in range(num_queries):
            cand = np.unique(np.concatenate([dense_candidates[q][dense_candidates[q] >= 0], sparse_candidates[q]]))
            scores = self._dense.reconstruct_batch(cand) @ q_dense[q]
            if q_sparse is not None:
                scores = scores + self._sparse_scores(q_sparse[q : q + 1], cand)[0]
            keep = top_columns(scores[None, :], min(n, len(cand)))[0]
            out_scores[q, : len(keep)], out_pos[q, : len(keep)] = scores[keep], cand[keep]
        return out_scores, out_pos

    # ---- size ------------------------------------------------------------------------------------------------------

    def memory_bytes_per_document(self) -> int:
        """Bytes per document of the stored representation: dense_dim * 4 (float32) + doc_top_k * 8 (int32 id +
        float32 weight) + 8 (the CSR row pointer) + the dense index's own overhead (HNSW: ~2 * hnsw_m * 4 bytes of
        graph links on level 0; IVF: an 8-byte id). Document id strings are not counted."""
        total = 0
        if self.dense_dim is not None:
            total += self.dense_dim * 4
            total += {"flat": 0, "hnsw": 2 * self.params["hnsw_m"] * 4, "ivf": 8}[self.index_type]
        if self.doc_top_k is not None:
            total += self.doc_top_k * 8 + 8
        return total

    # ---- persistence -----------------------------------------------------------------------------------------------

    def save(self, folder: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write the index to `folder` atomically: a temporary sibling folder is filled, then renamed into place
        (a previous index there is removed only after the new one is complete)."""
        folder = Path(folder)
        claim_index_folder(folder, overwrite)  # before the work, not after it
        self._finalize()
        with atomic_folder(folder, overwrite=overwrite) as tmp:
            files = []
            if self._dense is not None:
                faiss.write_index(self._dense, str(tmp / DENSE_FILE))
                files.append(DENSE_FILE)
            if self._sparse is not None:
                csr = self._sparse
                for name, array in zip(
                    SPARSE_FILES,
                    (csr.indptr.astype(np.int64), csr.indices.astype(np.int32), csr.data.astype(np.float32)),
                    strict=True,
                ):
                    np.save(tmp / name, array, allow_pickle=False)
                files.extend(SPARSE_FILES)
            (tmp / IDS_FILE).write_text(json.dumps(self.ids), encoding="utf-8")
            files.append(IDS_FILE)
            write_manifest(tmp, files, {
                "model_fingerprint": self.model_fingerprint,
                "dense_dim": self.dense_dim,
                "vocab_size": self.vocab_size,
                "doc_top_k": self.doc_top_k,
                "num_documents": len(self),
                "index_type": self.index_type,
                "index_params": self.params,
                "memory_bytes_per_document": self.memory_bytes_per_document(),
            })
        return folder

    @classmethod
    def load(cls, folder: str | os.PathLike, verify_checksums: bool = True) -> HybridIndex:
        """Load an index written by `save`.

        Raises:
            FileNotFoundError: the folder, its manifest or one of its files is missing (the message names it).
            ValueError: a file is truncated / has the wrong size or checksum, or the manifest is not ours.
        """
        folder = Path(folder)
        manifest = read_manifest(folder, verify_checksums)
        manifest_path = folder / MANIFEST
        params = manifest["index_params"]
        try:
            index = cls(
                manifest["dense_dim"],
                manifest["vocab_size"],
                manifest["doc_top_k"],
                index_type=manifest["index_type"],
                model_fingerprint=manifest["model_fingerprint"],
                **params,
            )
        except (TypeError, ValueError) as error:  # a field of another type, an unknown parameter
            raise ValueError(f"{manifest_path}: {one_line_message(error)}; the index folder is corrupted: "
                             "rebuild it") from None
        index.ids = json.loads((folder / IDS_FILE).read_text(encoding="utf-8"))
        if DENSE_FILE in manifest["files"]:
            index._dense = faiss.read_index(str(folder / DENSE_FILE))
            if index.index_type == "hnsw":
                index._dense.hnsw.efSearch = params["hnsw_ef_search"]
            if index.index_type == "ivf":
                index._dense.nprobe = min(params["ivf_nprobe"], params["ivf_nlist"])
                index._dense.make_direct_map()
        if SPARSE_FILES[0] in manifest["files"]:
            indptr, indices, data = (np.load(folder / name, allow_pickle=False) for name in SPARSE_FILES)
            index._sparse = sp.csr_matrix((data, indices, indptr), shape=(len(indptr) - 1, index.vocab_size))
        num = manifest["num_documents"]
        sizes = {
            "ids": len(index.ids),
            "dense": index._dense.ntotal if index._dense is not None else num,
            "sparse": index._sparse.shape[0] if index._sparse is not None else num,
        }
        if any(v != num for v in sizes.values()):
            raise ValueError(f"{folder}: manifest says {num} documents, the files hold {sizes}")
        return index


__all__ = ["HybridIndex", "model_fingerprint"]
