"""Model and config classes of the pre-training methods, shipped as Hub remote code.

`save_pretrained` copies these files beside each checkpoint, and `AutoModel.from_pretrained(...,
trust_remote_code=True)` imports them from there: so each file imports only torch and transformers
(`st_dupmae.py`: also sentence-transformers) and our own files as `from .file import Name`, in one flat folder.
"""
