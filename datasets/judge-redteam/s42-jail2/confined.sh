#!/bin/sh
# confined.sh WORKDIR CMD...: runs CMD through the real trampoline (confine.py) with WORKDIR as its
# only writable folder, ports [443], 30 s. From /work/main with the venv active.
W=$1; shift; mkdir -p "$W"
CFG=$(python -c 'import json, os, sys; w = sys.argv[1]; st = os.stat(w); print(json.dumps({"writable": [{"path": w, "dev": st.st_dev, "ino": st.st_ino}], "workdir": w, "cwd": w, "ports": [443], "timeout_s": 30}))' "$W")
exec python -I -S /work/main/runner/search/agents/confine.py "$CFG" -- "$@"
