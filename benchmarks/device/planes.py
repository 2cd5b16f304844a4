"""Lossless transport of a float32 safetensors file: the header, then its body as 4 byte planes, each xz-compressed
(the sign/exponent plane compresses far better than the mantissa planes). split SRC DIR | join DST DIR."""
import lzma
import struct
import sys
from pathlib import Path

import numpy as np


def split(src: Path, folder: Path) -> None:
    raw = src.read_bytes()
    start = 8 + struct.unpack("<Q", raw[:8])[0]
    (folder / "header.bin").write_bytes(raw[:start])
    planes = np.frombuffer(raw[start:], np.uint8).reshape(-1, 4).T
    for i, plane in enumerate(planes):
        (folder / f"plane{i}.xz").write_bytes(lzma.compress(plane.tobytes(), preset=6))


def join(dst: Path, folders: list[Path]) -> None:
    def find(name: str) -> Path:
        return next(f / name for f in folders if (f / name).is_file())

    planes = [np.frombuffer(lzma.decompress(find(f"plane{i}.xz").read_bytes()), np.uint8) for i in range(4)]
    body = np.stack(planes, axis=1).reshape(-1)
    dst.write_bytes(find("header.bin").read_bytes() + body.tobytes())


if __name__ == "__main__":
    if sys.argv[1] == "split":
        split(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        join(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]])
