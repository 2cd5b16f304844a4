"""`retromae publish`: validate a model folder, list what would be uploaded, then upload it to the Hub."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..export.publishing import ValidationReport, check_repo_id, prepare_publish
from ..export.uploading import UploadListing, size_text, upload_to_hub
from ..inputs.arguments import LIST_FLAG, DashValueError, start_command


@dataclass
class PublishArguments:
    folder: str = field(metadata={"help": "the sentence-transformers folder to upload (e.g. a retromae finetune output)"})
    repo_id: str = field(metadata={"help": "Hub repository, owner/name (created if it does not exist)"})
    private: bool = field(default=False, metadata={"help": "create the repository as private"})
    revision: str | None = field(default=None, metadata={"help": "branch to upload to (default: main)"})
    commit_message: str | None = field(default=None, metadata={"help": "commit message"})
    create_pr: bool = field(default=False, metadata={"help": "open a pull request instead of committing to the branch"})
    dry_run: bool = field(default=False, metadata={"help": "validate and list the files the upload would send; "
                                                   "upload nothing"})
    exclude: list[str] = field(default_factory=list, metadata={
        "help": "leave out the files matching these patterns, as `hf upload --exclude` (e.g. 'eval/' for a folder, "
        "'*.npy')", **LIST_FLAG})
    allow_extra_files: bool = field(default=False, metadata={
        "help": "upload files that are no part of a sentence-transformers model (not config, weights, tokenizer, "
        "card, remote code or a module folder of modules.json), which are refused otherwise"})


def publish_command(argv: list[str]) -> int:
    """`retromae publish FOLDER OWNER/NAME [--private] [--dry-run] [--exclude GLOB ...]` (alternative: `hf upload
    OWNER/NAME FOLDER .`)."""
    try:
        (args,) = start_command(
            argv, PublishArguments, prog="retromae publish",
            description="Validate a sentence-transformers folder (weights, config, tokenizer, modules.json, remote "
            "code, model card, and that it loads), list the files it would upload (files that are no part of the "
            "model and secret-looking files are refused), then upload it with huggingface_hub. Log in first with "
            "`hf auth login`. Without validation: hf upload OWNER/NAME FOLDER .", positional=["folder", "repo_id"],
        )
    except DashValueError as error:  # `--repo-id -x/y`: no Hub id starts with '-', which says more than argparse
        if error.dest == "repo_id":
            check_repo_id(error.value)
        raise
    report, listing = prepare_publish(args.folder, args.repo_id, exclude=args.exclude,
                                      allow_extra_files=args.allow_extra_files)
    _print_plan(args, report, listing)
    if args.dry_run:
        print("retromae: --dry-run: nothing uploaded", flush=True)
        return 0
    commit = upload_to_hub(Path(args.folder), args.repo_id, exclude=args.exclude, private=args.private or None,
                           revision=args.revision, commit_message=args.commit_message, create_pr=args.create_pr)
    url = getattr(commit, "commit_url", None) or getattr(commit, "pr_url", None) or str(commit)
    print(f"retromae: uploaded to https://huggingface.co/{args.repo_id} ({url})", flush=True)
    return 0


def _print_plan(args: PublishArguments, report: ValidationReport, listing: UploadListing) -> None:
    """The validation's result and every file the upload sends, with the total size."""
    remote = f", remote code: {', '.join(report.remote_code_files)}" if report.needs_remote_code else ""
    model_class = "" if report.model_class == "SentenceTransformer" else f"{report.model_class}, "
    print(f"retromae: {args.folder} is valid ({model_class}{len(report.modules)} modules, embedding dimension "
          f"{report.embedding_dim}{remote})", flush=True)
    verb = "would upload" if args.dry_run else "uploading"
    print(f"retromae: {verb} {len(listing.files)} files, {size_text(listing.total_bytes)}, to {args.repo_id}:",
          flush=True)
    if listing.files:
        print("\n".join(listing.lines()), flush=True)
    if listing.extra:  # uploaded as --allow-extra-files asks
        print(f"retromae: warning: --allow-extra-files: uploading files that are no part of the model: "
              f"{listing.extras_text()}", flush=True)


__all__ = ["publish_command"]
