"""`retromae publish`: validate a model folder, then upload it to the Hub."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..export.publishing import check_repo_id, publish
from ..inputs.arguments import DashValueError, start_command


@dataclass
class PublishArguments:
    folder: str = field(metadata={"help": "the sentence-transformers folder to upload (e.g. a retromae finetune output)"})
    repo_id: str = field(metadata={"help": "Hub repository, owner/name (created if it does not exist)"})
    private: bool = field(default=False, metadata={"help": "create the repository as private"})
    revision: str | None = field(default=None, metadata={"help": "branch to upload to (default: main)"})
    commit_message: str | None = field(default=None, metadata={"help": "commit message"})
    create_pr: bool = field(default=False, metadata={"help": "open a pull request instead of committing to the branch"})
    dry_run: bool = field(default=False, metadata={"help": "validate only; upload nothing"})


def publish_command(argv: list[str]) -> int:
    """`retromae publish FOLDER OWNER/NAME [--private] [--dry-run]` (alternative: `hf upload OWNER/NAME FOLDER .`)."""
    try:
        (args,) = start_command(
            argv, PublishArguments, prog="retromae publish",
            description="Validate a sentence-transformers folder (weights, config, tokenizer, modules.json, remote "
            "code, model card, and that it loads), then upload it with huggingface_hub. Log in first with `hf auth "
            "login`. Without validation: hf upload OWNER/NAME FOLDER .", positional=["folder", "repo_id"],
        )
    except DashValueError as error:  # `--repo-id -x/y`: no Hub id starts with '-', which says more than argparse
        if error.dest == "repo_id":
            check_repo_id(error.value)
        raise
    report, commit = publish(
        args.folder, args.repo_id, private=args.private or None, revision=args.revision,
        commit_message=args.commit_message, create_pr=args.create_pr, dry_run=args.dry_run,
    )
    remote = f", remote code: {', '.join(report.remote_code_files)}" if report.needs_remote_code else ""
    print(f"retromae: {args.folder} is valid ({len(report.modules)} modules, embedding dimension "
          f"{report.embedding_dim}{remote})", flush=True)
    if commit is None:
        print("retromae: --dry-run: nothing uploaded", flush=True)
    else:
        url = getattr(commit, "commit_url", None) or getattr(commit, "pr_url", None) or str(commit)
        print(f"retromae: uploaded to https://huggingface.co/{args.repo_id} ({url})", flush=True)
    return 0


__all__ = ["publish_command"]
