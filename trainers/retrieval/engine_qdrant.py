"""DupMAE's hybrid index in Qdrant (`retromae index --engine qdrant`): the dense [CLS] part and the sparse OT part of
each document are the named vectors ``dense`` (dot product) and ``sparse`` (a Qdrant sparse vector) of one point.

A query is answered with eq. 12, ``score(q, d) = h_q . h_d + sum_i mu_q[i] mu_d[i]``, in one Qdrant query:

1. candidates: the dense top-`candidates` and the sparse top-`candidates` (two prefetches);
2. two rescoring prefetches score every candidate of that union by its dense part and by its sparse part;
3. a formula query adds the two scores (`$score[0] + $score[1]`; a document that shares no vocabulary id with the
   query has no sparse score and gets the default 0, its exact value).

So every returned score is eq. 12 exactly, and the ranking is exact over the union of the candidates -- the same
contract as `HybridIndex` with ``index_type="hnsw"``. A weighted fusion (RRF, DBSF) would not reproduce eq. 12.
In local mode (`QdrantClient(path=...)`) the prefetches are brute force, so the candidates are the exact top ones;
a Qdrant server searches the dense part with HNSW.

The index folder holds ``qdrant/`` (the local storage), ``ids.json`` and ``manifest.json`` (``"engine": "qdrant"``);
built with a server's client (`build_folder(..., client=QdrantClient(url=...))`) it keeps the manifest and ids only,
and `load(folder, client=...)` reopens it. Local mode scores sparse vectors in pure Python (~1 query/s over 5,000
documents, ~0.1 over 100,000): fine for tests and small corpora, a server beyond that.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..inputs.outputs import atomic_folder
from .hybrid_index import HybridIndex
from .hybrid_parts import HybridIndexBase, document_parts
from .index_files import IDS_FILE, claim_index_folder, index_engine, read_manifest, write_manifest

try:  # the optional extra `retromae[qdrant]`
    from qdrant_client import QdrantClient, models
except ImportError:
    QdrantClient = models = None

ENGINE = "qdrant"
QDRANT_EXTRA_HINT = 'pip install "retromae[qdrant]"'
STORAGE = "qdrant"  # the local storage folder inside the index folder
COLLECTION = "retromae"
DENSE, SPARSE = "dense", "sparse"
UPSERT_BATCH = 512


def qdrant_available() -> bool:
    return QdrantClient is not None


def require_qdrant() -> None:
    """Raise ImportError naming the extra when qdrant-client is not installed."""
    if not qdrant_available():
        raise ImportError(f"the qdrant engine needs qdrant-client: {QDRANT_EXTRA_HINT}")


def sparse_rows(matrix: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each row of a dense array or scipy matrix as (sorted column ids, values) of its non-zero entries."""
    csr = sp.csr_matrix(matrix, dtype=np.float32)
    csr.eliminate_zeros()
    csr.sort_indices()
    return [(csr.indices[a:b], csr.data[a:b]) for a, b in zip(csr.indptr[:-1], csr.indptr[1:], strict=True)]


class QdrantHybridIndex(HybridIndexBase):
    """A DupMAE hybrid index in a Qdrant collection (local or server), searched with eq. 12 (see the module).

    Args:
        client: a `QdrantClient` (`QdrantClient(path=...)` embedded, `QdrantClient(url=...)` a server).
        dense_dim / vocab_size / doc_top_k / model_fingerprint: as `HybridIndex` (None: no such part / unchecked).
        candidates: dense and sparse candidates per query (default 10 x top_n, >= 100).
        collection: the collection's name.
    """

    def __init__(self, client: Any, dense_dim: int | None, vocab_size: int, doc_top_k: int | None, *,
                 model_fingerprint: str | None = None, candidates: int | None = None, collection: str = COLLECTION):
        require_qdrant()
        super().__init__(dense_dim, vocab_size, doc_top_k, model_fingerprint=model_fingerprint, candidates=candidates)
        self.client, self.collection, self.candidates = client, collection, candidates

    def create_collection(self) -> None:
        """Create the (empty) collection: a `dense` DOT vector and/or a `sparse` vector per point."""
        dense = {DENSE: models.VectorParams(size=self.dense_dim, distance=models.Distance.DOT)} if self.dense_dim else {}
        sparse = {SPARSE: models.SparseVectorParams()} if self.doc_top_k else None
        self.client.create_collection(self.collection, vectors_config=dense, sparse_vectors_config=sparse)

    def defer_local_syncs(self) -> bool:
        """Embedded storage only: stop syncing its SQLite file after every point (`PRAGMA synchronous=OFF`).

        Local mode commits each point on its own: ~5 ms of fsync per document, 9 minutes for 100,000. A build into a
        temporary folder (renamed into place once complete and closed) needs no point-by-point durability. Reaches
        into qdrant-client's private attributes; returns False, changing nothing, where they differ (a server)."""
        collections = getattr(getattr(self.client, "_client", None), "collections", None)
        storage = getattr(collections.get(self.collection), "storage", None) if isinstance(collections, dict) else None
        connection = getattr(storage, "storage", None)
        if not isinstance(connection, sqlite3.Connection):
            return False
        connection.execute("PRAGMA synchronous=OFF")
        return True

    # ---- construction ----------------------------------------------------------------------------------------------

    def add(self, ids: Sequence[str], dense: Any = None, sparse_indices: Any = None, sparse_values: Any = None) -> None:
        """Add documents, as `HybridIndex.add`; point ids are positions in `self.ids`, payload ``{"doc_id": id}``."""
        new_ids, dense, idx, val = self._check_documents(ids, dense, sparse_indices, sparse_values)
        n = len(new_ids)
        vectors: list[dict[str, Any]] = [{} for _ in range(n)]
        if dense is not None:
            for row, vector in zip(vectors, dense.tolist(), strict=True):
                row[DENSE] = vector
        if idx is not None:
            rows = np.repeat(np.arange(n), self.doc_top_k)
            matrix = sp.coo_matrix((val.reshape(-1), (rows, idx.reshape(-1))), shape=(n, self.vocab_size))
            for row, (indices, values) in zip(vectors, sparse_rows(matrix), strict=True):
                if len(indices):  # an all-zero OT part (an empty text) is stored without a sparse vector
                    row[SPARSE] = models.SparseVector(indices=indices.tolist(), values=values.tolist())
        start = len(self.ids)
        points = [models.PointStruct(id=start + i, vector=vectors[i], payload={"doc_id": new_ids[i]}) for i in range(n)]
        for b in range(0, n, UPSERT_BATCH):
            self.client.upsert(self.collection, points=points[b : b + UPSERT_BATCH], wait=True)
        self.ids.extend(new_ids)

    @classmethod
    def build(cls, model: Any, texts: Sequence[str], ids: Sequence[str] | None, client: Any, batch_size: int = 32, *,
              encode_chunk: int = 256, show_progress_bar: bool = False, **kwargs: Any) -> QdrantHybridIndex:
        """Encode `texts` as documents with a DupMAE SentenceTransformer into a new collection on `client`."""
        ids = [str(i) for i in range(len(texts))] if ids is None else [str(i) for i in ids]
        if len(ids) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(ids)} ids")
        layout = HybridIndex.build(model, [], [])  # the model's parts, dims and fingerprint
        index = cls(client, layout.dense_dim, layout.vocab_size, layout.doc_top_k,
                    model_fingerprint=layout.model_fingerprint, **kwargs)
        index.create_collection()
        index.defer_local_syncs()
        parts = index.parts()
        for start in range(0, len(texts), encode_chunk):
            chunk = list(texts[start : start + encode_chunk])
            outputs = model.encode_document(chunk, batch_size=batch_size, output_value=None,
                                            show_progress_bar=show_progress_bar)
            index.add(ids[start : start + len(chunk)], **document_parts(outputs, parts))
        return index

    @classmethod
    def build_folder(cls, model: Any, texts: Sequence[str], ids: Sequence[str] | None, folder: str | os.PathLike,
                     batch_size: int = 32, *, overwrite: bool = False, client: Any = None,
                     **kwargs: Any) -> Path:
        """`build` into a new index `folder`, written atomically like `HybridIndex.save` (a temporary sibling folder,
        renamed into place once complete). The vectors go to an embedded Qdrant in the folder, or with `client` (a
        server: `QdrantClient(url=...)`, left open) to that client's collection; the folder then keeps the manifest
        and the ids only."""
        require_qdrant()
        folder = Path(folder)
        claim_index_folder(folder, overwrite)
        with atomic_folder(folder, overwrite=overwrite) as tmp:
            own = client is None
            client = QdrantClient(path=str(tmp / STORAGE)) if own else client
            try:
                index = cls.build(model, texts, ids, client, batch_size, **kwargs)
            finally:
                if own:
                    client.close()
            index.write_manifest(tmp, storage="embedded" if own else "server")
        return folder

    def write_manifest(self, folder: Path, storage: str = "embedded") -> None:
        """`ids.json` and the manifest (``engine: qdrant``; `storage`: "embedded" in `folder`, or "server")."""
        (folder / IDS_FILE).write_text(json.dumps(self.ids), encoding="utf-8")
        write_manifest(folder, [IDS_FILE], {
            "engine": ENGINE, "model_fingerprint": self.model_fingerprint, "dense_dim": self.dense_dim,
            "vocab_size": self.vocab_size, "doc_top_k": self.doc_top_k, "num_documents": len(self),
            "index_type": "flat", "index_params": {"candidates": self.candidates, "collection": self.collection, "storage": storage},
            "memory_bytes_per_document": self.memory_bytes_per_document(),
        })

    @classmethod
    def load(cls, folder: str | os.PathLike, verify_checksums: bool = True, client: Any = None) -> QdrantHybridIndex:
        """Open an index folder written by `build_folder`: its embedded Qdrant (locked until `close`), or with
        `client` the collection on that client (a server, for a folder built with one).

        Raises:
            FileNotFoundError / ValueError: as `HybridIndex.load`; ImportError: qdrant-client is not installed.
        """
        require_qdrant()
        folder = Path(folder)
        manifest = read_manifest(folder, verify_checksums, engine=ENGINE)
        params = manifest["index_params"]
        if client is None and params.get("storage") == "server":
            raise ValueError(f"{folder}: its vectors are on a Qdrant server; pass client=QdrantClient(url=...)")
        if client is None and not (folder / STORAGE).is_dir():
            raise FileNotFoundError(f"the Qdrant storage {STORAGE}/ is missing from {folder}; rebuild the index")
        client = QdrantClient(path=str(folder / STORAGE)) if client is None else client
        index = cls(client, manifest["dense_dim"], manifest["vocab_size"],
                    manifest["doc_top_k"], model_fingerprint=manifest["model_fingerprint"],
                    candidates=params.get("candidates"), collection=params.get("collection", COLLECTION))
        index.ids = json.loads((folder / IDS_FILE).read_text(encoding="utf-8"))
        if len(index.ids) != manifest["num_documents"]:
            raise ValueError(f"{folder}: manifest says {manifest['num_documents']} documents, {IDS_FILE} holds "
                             f"{len(index.ids)}")
        return index

    def close(self) -> None:
        self.client.close()

    # ---- search ----------------------------------------------------------------------------------------------------

    def search(self, query_dense: Any = None, query_sparse: Any = None, top_n: int = 10, *,
               model_fingerprint: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-n documents per query by eq. 12, as `HybridIndex.search`: `(scores, positions)`, each
        `(num_queries, min(top_n, num_documents))`, best first (a row may end early only if the candidates do)."""
        self.check_fingerprint(model_fingerprint)
        if top_n < 1:
            raise ValueError(f"top_n={top_n} must be >= 1")
        dense, sparse, num = self._check_queries(query_dense, query_sparse)
        sparse = sparse_rows(sparse) if sparse is not None else None
        n = min(top_n, len(self))
        scores, positions = np.full((num, n), -np.inf, np.float32), np.full((num, n), -1, np.int64)
        if num == 0 or n == 0:
            return scores, positions
        c = min(len(self), self.candidates or max(10 * n, 100))
        requests = [self._request(None if dense is None else dense[q], None if sparse is None else sparse[q], n, c)
                    for q in range(num)]
        for q, response in enumerate(self.client.query_batch_points(self.collection, requests=requests)):
            for j, point in enumerate(response.points[:n]):
                scores[q, j], positions[q, j] = point.score, int(point.id)
        return scores, positions

    def _request(self, dense: np.ndarray | None, sparse: tuple[np.ndarray, np.ndarray] | None, n: int, c: int) -> Any:
        """One query: eq. 12 over the union of the dense and sparse top-c (see the module)."""
        parts = []
        if dense is not None:
            parts.append((dense.tolist(), DENSE))
        if sparse is not None and len(sparse[0]):  # an all-zero OT query adds 0 to every document: dense alone
            parts.append((models.SparseVector(indices=sparse[0].tolist(), values=sparse[1].tolist()), SPARSE))
        if len(parts) == 1:
            return models.QueryRequest(query=parts[0][0], using=parts[0][1], limit=n, with_payload=False)
        if not parts:  # an OT-only index and an all-zero query: every score is 0
            return models.QueryRequest(limit=n, with_payload=False)
        union = [models.Prefetch(query=query, using=using, limit=c) for query, using in parts]
        rescored = [models.Prefetch(prefetch=union, query=query, using=using, limit=2 * c) for query, using in parts]
        formula = models.FormulaQuery(formula=models.SumExpression(sum=["$score[0]", "$score[1]"]),
                                      defaults={"$score[0]": 0.0, "$score[1]": 0.0})
        return models.QueryRequest(prefetch=rescored, query=formula, limit=n, with_payload=False)

    def parts(self) -> SimpleNamespace:
        """What `document_parts` reads of the model's pooling module, from the index."""
        return SimpleNamespace(has_dense=self.dense_dim is not None, has_sparse=self.doc_top_k is not None,
                               vocab_size=self.vocab_size)

    def memory_bytes_per_document(self) -> int:
        """Raw vector bytes per document: dense_dim * 4 + doc_top_k * 8 (Qdrant's own index overhead not counted)."""
        return (self.dense_dim or 0) * 4 + (self.doc_top_k or 0) * 8


def load_index(folder: str | os.PathLike, verify_checksums: bool = True) -> HybridIndex | QdrantHybridIndex:
    """The index in `folder` with the engine it was built with (its manifest's ``engine``).

    Raises:
        FileNotFoundError / ValueError: as `HybridIndex.load`; ImportError: a qdrant index without qdrant-client.
    """
    if index_engine(Path(folder)) == ENGINE:
        return QdrantHybridIndex.load(folder, verify_checksums)
    return HybridIndex.load(folder, verify_checksums)


__all__ = ["ENGINE", "QDRANT_EXTRA_HINT", "QdrantHybridIndex", "load_index", "qdrant_available"]
