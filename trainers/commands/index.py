"""`retromae index` and `retromae search`: build and search an exact DupMAE hybrid index (ours, or in Qdrant)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from retromae.modeling.st_dupmae import is_dupmae_pooling

from ..data.passages import numbered_passages
from ..data.reading import check_text_format_applies, iter_decoded_lines, read_corpus
from ..data.tokenize import report_truncation
from ..export.dupmae import load_dupmae_sentence_transformer
from ..inputs.arguments import LIST_FLAG, start_command
from ..inputs.errors import UserError, one_line_message
from ..inputs.folders import check_model_folder, is_local_path
from ..inputs.io import atomic_file
from ..inputs.outputs import claim_output
from ..retrieval.beir import doc_text, is_beir_folder, read_beir_corpus, read_beir_queries
from ..retrieval.engine_qdrant import QDRANT_EXTRA_HINT, QdrantHybridIndex, load_index, qdrant_available
from ..retrieval.hybrid_index import HybridIndex, claim_index_folder

logger = logging.getLogger(__name__)


@dataclass
class IndexArguments:
    model: str = field(metadata={"help": "a DupMAE sentence-transformers folder (`retromae export` of a dupmae run)"})
    corpus: str = field(metadata={"help": "documents: a BEIR folder / corpus.jsonl (ids from `_id`) or any corpus "
                                  "`retromae pretrain` reads (ids: a .txt or .jsonl file's line numbers, else passage "
                                  "numbers from 0)"})
    output_dir: str = field(metadata={"help": "the index folder to write"})
    text_format: Literal["auto", "lines", "blocks"] = field(default="auto", metadata={
        "help": "how a .txt corpus splits into documents: lines (one per line), blocks (separated by blank lines) or "
        "auto (blocks when a blank line separates two text lines), as `retromae pretrain` reads it"})
    index_type: Literal["flat", "hnsw", "ivf"] = field(default="flat", metadata={"help": "dense part: exact (flat) or approximate"})
    engine: Literal["faiss", "qdrant"] = field(default="faiss", metadata={
        "help": "faiss: our own index files; qdrant: an embedded Qdrant collection (retromae[qdrant])"})
    batch_size: int = field(default=32, metadata={"help": "documents per encoding batch"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing index folder"})


@dataclass
class SearchArguments:
    index: str = field(metadata={"help": "an index folder written by `retromae index`"})
    model: str = field(metadata={"help": "the DupMAE sentence-transformers folder the index was built with"})
    query: list[str] = field(
        default_factory=list,
        metadata={"help": "query text(s): --query 'first' --query 'second' or --query 'first' 'second'", **LIST_FLAG},
    )
    queries: str | None = field(default=None, metadata={"help": "a BEIR queries.jsonl or a .txt file with one query per line"})
    top_n: int = field(default=10, metadata={"help": "results per query"})
    output: str | None = field(default=None, metadata={"help": "write results as JSONL {query_id, query, results}"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing --output file"})


def _documents(corpus: str, text_format: str = "auto") -> tuple[list[str], list[str]]:
    """Ids and texts: a BEIR folder, or a .jsonl where any record has an `_id` (then every record needs one), keeps
    its ids; a .txt or other .jsonl file is numbered by the line each passage starts on, so blank passages (not
    indexed) shift no id; any other corpus (a folder of files, a datasets folder) by passage, from 0."""
    path = Path(corpus)
    beir_file = path / "corpus.jsonl" if is_beir_folder(path) else path
    if beir_file.suffix.lower() == ".jsonl" and beir_file.is_file():
        with beir_file.open(encoding="utf-8", errors="replace") as handle:
            has_ids = any('"_id"' in line for line in handle)  # a key: inside a JSON string the quotes are escaped
        if has_ids or beir_file != path:
            docs = read_beir_corpus(beir_file)
            texts = [doc_text(d.get("title"), d["text"]) for d in docs.values()]
            blank = [doc_id for doc_id, text in zip(docs, texts, strict=True) if not text]
            if blank:  # kept, as BEIR and mteb keep them: ids must match the qrels
                logger.warning("%s: %d document(s) without title or text are indexed as empty texts (ids: %s)",
                               beir_file, len(blank), ", ".join(blank[:5]) + (", ..." if len(blank) > 5 else ""))
            return list(docs), texts
    if path.is_file() and path.suffix in {".txt", ".jsonl"}:
        numbered = list(numbered_passages(path, text_format))
        if not numbered:
            raise UserError(f"--corpus {corpus}: every passage is blank; nothing to index")
        return [str(line) for line, _ in numbered], [text for _, text in numbered]
    texts = list(read_corpus(corpus, text_format=text_format)["text"])
    return [str(i) for i in range(len(texts))], texts


def _queries(args: SearchArguments) -> list[tuple[str, str]]:
    queries = [(f"q{i}", text) for i, text in enumerate(args.query)]
    if args.queries:
        path = Path(args.queries)
        if not path.is_file():
            raise UserError(f"--queries {path} " + ("is a folder; give a file" if path.is_dir() else "not found"))
        if path.suffix.lower() not in {".jsonl", ".txt"}:
            raise UserError(f"--queries {path}: give a BEIR queries.jsonl or a .txt file with one query per "
                            f"line (a {path.suffix or 'suffix-less'} file would be read line by line as queries)")
        if path.suffix.lower() == ".jsonl":
            read = read_beir_queries(path).items()
            blank = next((qid for qid, text in read if not text.strip()), None)
            if blank is not None:
                raise UserError(f"{path}: query {blank!r} has no text; give it some, or remove it")
            queries += list(read)
        else:
            queries += [(f"{path.stem}:{n}", line.strip()) for n, line in iter_decoded_lines(str(path)) if line.strip()]
    if not queries:
        raise UserError(f"--queries {args.queries} holds no query; give one per line" if args.queries else
                        "no query given: pass --query TEXT (repeatable) or --queries FILE")
    return queries


def _load_hybrid_model(folder: str, command: str) -> Any:
    """The DupMAE sentence-transformers model in `folder`; any other model is refused in one line naming the fix."""
    check_model_folder(folder, purpose=f"{command} --model")
    if is_local_path(folder) and not (Path(folder) / "modules.json").is_file():
        export = Path(folder) / "encoder"
        fix = (f"pass its exported encoder, {export}" if (export / "modules.json").is_file()
               else f"export it first: retromae export {folder} OUTPUT_DIR")
        raise UserError(f"--model {folder} is not a sentence-transformers folder (no modules.json): {fix}")
    try:
        model = load_dupmae_sentence_transformer(folder)
    except Exception as error:  # a damaged folder (a module's files missing), an unknown or unreachable Hub id
        fix = ("export it again (a module's files are missing or damaged)" if Path(folder).exists()
               else "give a local folder, or a Hub id that exists (and the network)")
        raise UserError(f"--model {folder} does not load ({type(error).__name__}: "
                        f"{one_line_message(error)}); {fix}") from None
    if not any(is_dupmae_pooling(module) for module in model.modules()):
        raise UserError(
            f"--model {folder} is not a DupMAE hybrid model (it has no DupMAEPooling module): retromae {command} is "
            "for the export of a dupmae pre-training, or that model fine-tuned; a dense model is searched with "
            "retromae evaluate --search faiss"
        )
    return model


def index_command(argv: list[str]) -> int:
    """`retromae index`: encode a corpus with a DupMAE model and write an exact hybrid index."""
    (args,) = start_command(argv, IndexArguments, prog="retromae index", description=index_command.__doc__,
                            positive=("batch_size",))
    if args.engine == "qdrant" and not qdrant_available():
        raise UserError(f"--engine qdrant needs qdrant-client: {QDRANT_EXTRA_HINT}")
    if args.engine == "qdrant" and args.index_type != "flat":
        raise UserError(f"--index-type {args.index_type} is for --engine faiss; --engine qdrant picks its own")
    # refused before hours of encoding, not after
    check_text_format_applies(args.text_format, args.corpus, any_corpus_jsonl_is_beir=True)  # as `_documents` reads
    claim_index_folder(Path(args.output_dir), args.overwrite, inputs={"--model": args.model,
                                                                          "--corpus": args.corpus})
    model = _load_hybrid_model(args.model, "index")
    ids, texts = _documents(args.corpus, args.text_format)
    report_truncation(texts, model.tokenizer, model.max_seq_length - model.tokenizer.num_special_tokens_to_add(),
                      args.corpus, fix="the index encodes only the start of each")
    if args.engine == "qdrant":
        folder = QdrantHybridIndex.build_folder(model, texts, ids, args.output_dir, batch_size=args.batch_size,
                                                overwrite=args.overwrite, show_progress_bar=True)
        print(f"retromae: indexed {len(ids)} documents -> {folder} (qdrant)", flush=True)
        return 0
    index = HybridIndex.build(model, texts, ids, batch_size=args.batch_size, index_type=args.index_type,
                              show_progress_bar=True)
    folder = index.save(args.output_dir, overwrite=args.overwrite)
    print(f"retromae: indexed {len(ids)} documents -> {folder} "
          f"({index.memory_bytes_per_document()} bytes per document)", flush=True)
    return 0


PREVIEW_QUERIES, PREVIEW_RESULTS = 20, 5  # what `search --output` also prints


def search_command(argv: list[str]) -> int:
    """`retromae search`: top-n documents by the exact hybrid score for one or more queries."""
    (args,) = start_command(argv, SearchArguments, prog="retromae search", description=search_command.__doc__,
                            positive=("top_n",))
    if args.output:
        claim_output(Path(args.output), "--output", args.overwrite, kind="file",
                     inputs={"--queries": args.queries, "--index": args.index, "--model": args.model})
    queries = _queries(args)  # a bad query is refused before seconds of loading
    try:
        index = load_index(args.index)  # with the engine that built it
    except (FileNotFoundError, ImportError) as error:  # a missing file (named), a qdrant index without qdrant-client
        raise UserError(f"--index: {error}") from None
    model = _load_hybrid_model(args.model, "search")
    try:
        hits = index.search_texts(model, [text for _, text in queries], top_n=args.top_n)
    finally:
        if isinstance(index, QdrantHybridIndex):
            index.close()  # the embedded storage's lock
    records = [{"query_id": qid, "query": text, "results": [{"id": d, "score": round(float(s), 4)} for d, s in found]}
               for (qid, text), found in zip(queries, hits, strict=True)]
    preview = bool(args.output)  # every result goes to the file; the terminal gets a glance at them
    for record in records[:PREVIEW_QUERIES] if preview else records:
        results = record["results"][:PREVIEW_RESULTS] if preview else record["results"]
        print(f"{record['query'][:60]!r}: " + ", ".join(f"{r['id']} ({r['score']})" for r in results))
    if args.output:
        out = Path(args.output)
        with atomic_file(out) as handle:
            handle.writelines(json.dumps(r) + "\n" for r in records)
        print(f"retromae: wrote {len(records)} result lists of up to {args.top_n} to {out} (above: the first "
              f"{PREVIEW_RESULTS} of the first {PREVIEW_QUERIES} queries)", flush=True)
    return 0
