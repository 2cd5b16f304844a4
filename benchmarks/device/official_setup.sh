#!/bin/bash
# The official RetroMAE pre-training code (github.com/staoxiao/RetroMAE, src/pretrain) in its own environment, for
# benchmarks/official_side_by_side.py. Nothing of that code is committed here.
#   official_setup.sh copy [MIRROR]   here: its src/pretrain (+ LICENSE) into .dev/official/, and the wheels of its
#                                     environment (transformers 4.44.2, tokenizers 0.19.1, huggingface_hub 0.24.6;
#                                     CPython 3.12, x86-64, as on the lent GPU) into .dev/official/whl/
#   official_setup.sh install [SITE [WHEEL...]]  on the device: those wheels (or the WHEELs named) into SITE
#                                     (default /tmp/official_site), apart from the machine's own packages, and an
#                                     import check of the official modules there
# MIRROR: a git directory of the repository (default /work/.mirror/staoxiao+RetroMAE/repo, from the `fetch` tool).
# Local CPU smoke (throughput.sh with DEVICE_SMOKE=1): install with this machine's own tokenizers 0.19.1 wheel.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=.dev/official
WHEELS=(transformers==4.44.2 tokenizers==0.19.1 huggingface_hub==0.24.6)

copy() {
  local mirror=${1:-/work/.mirror/staoxiao+RetroMAE/repo} tag=${PY_TAG:-cp312} version
  version=${tag#cp}; version=${version:0:1}.${version:1}
  rm -rf "$DEST/pretrain" && mkdir -p "$DEST/whl"
  git --git-dir="$mirror" archive HEAD src/pretrain LICENSE | tar -x -C "$DEST"
  mv "$DEST/src/pretrain" "$DEST/pretrain" && rmdir "$DEST/src"
  git --git-dir="$mirror" rev-parse HEAD > "$DEST/COMMIT"
  rm -f "$DEST"/whl/*.whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST/whl" "${WHEELS[@]}" 2>&1 | grep -v "^WARNING: Location" || true
  echo "official code $(cut -c1-12 "$DEST/COMMIT") -> $DEST/pretrain; wheels: $(ls "$DEST/whl" | tr '\n' ' ')"
  du -sh "$DEST"
}

install() {
  local site=${1:-/tmp/official_site}
  shift || true
  (( $# )) || set -- "$DEST"/whl/*.whl
  rm -rf "$site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$@"
  # transformers 4.44.2 checks tokenizers, huggingface_hub, numpy, safetensors, ... at import: this fails loudly here
  PYTHONPATH="$site:$DEST" PYTHONNOUSERSITE=1 python3 - <<'PY'
import importlib.util, sys, types
stub = types.ModuleType("datasets")  # official data.py imports datasets.Dataset, which the benchmark does not use
stub.__spec__ = importlib.util.spec_from_loader("datasets", loader=None)
stub.Dataset = object
sys.modules["datasets"] = stub
import tokenizers, torch, transformers
from pretrain.data import RetroMAECollator
from pretrain.modeling import RetroMAEForPretraining
print(f"official env: python {sys.version.split()[0]}, transformers {transformers.__version__}, tokenizers "
      f"{tokenizers.__version__}, torch {torch.__version__}; {RetroMAECollator.__name__}, "
      f"{RetroMAEForPretraining.__name__} import")
PY
}

case "${1:-}" in
  copy) shift; copy "$@" ;;
  install) shift; install "$@" ;;
  *) echo "usage: $0 copy [MIRROR] | install [SITE [WHEEL...]]" >&2; exit 2 ;;
esac
