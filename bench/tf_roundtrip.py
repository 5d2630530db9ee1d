"""A fine-tuned BERT-family run exported to TensorFlow and checked by TensorFlow itself: every
tensor of the exported checkpoint as ``tf.train.load_checkpoint`` reads it, and the
SavedModel's logits against the PyTorch model's on dev texts.

1. ``xdpx.tf_checkpoint.export_google_bert`` writes the run's best checkpoint in Google's
   BERT layout under ``--out`` (xdpx's own tensor-bundle writer, no TensorFlow);
2. the expected tensors (the run's weights under Google's names) and the PyTorch logits of
   ``--texts`` dev texts (the run's raw dev file, encoded by the run's tokenizer, padded with
   id 0) are written beside it;
3. ``--tf-python`` (an interpreter with TensorFlow; default this one) reads the checkpoint
   with ``tf.train.load_checkpoint`` and compares every tensor (bit for bit: dtype, shape,
   bytes), builds the SavedModel (``xdpx.tf_savedmodel``, which needs only TensorFlow and
   numpy), loads it with ``tf.saved_model.load`` and runs ``serving_default`` on the same ids;
4. ``--json`` gets the counts, the largest logit difference and TensorFlow's version.

Usage::

    python bench/tf_roundtrip.py --checkpoint 'models/minilm/<best>' --json reports/tf_roundtrip.json
    python bench/tf_roundtrip.py --checkpoint 'models/minilm/<best>' --tf-python /opt/tf/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: What runs under --tf-python (TensorFlow and numpy only; xdpx.tf_savedmodel from the repo).
TF_SIDE = r"""
import json, sys
import numpy as np
import tensorflow as tf
from xdpx.tf_savedmodel import build_saved_model

out = sys.argv[1]
expected = np.load(f"{out}/expected.npz")
reader = tf.train.load_checkpoint(f"{out}/tf/bert_model.ckpt")
names = sorted(reader.get_variable_to_shape_map())
want = {k.replace("|", "/"): expected[k] for k in expected.files}
mismatched = [n for n in names if n not in want or reader.get_tensor(n).dtype != want[n].dtype
              or reader.get_tensor(n).shape != want[n].shape
              or reader.get_tensor(n).tobytes() != want[n].tobytes()]
missing = sorted(set(want) - set(names))
build_saved_model(f"{out}/tf", f"{out}/saved_model")
loaded = tf.saved_model.load(f"{out}/saved_model")
io = np.load(f"{out}/logits.npz")
got = loaded.signatures["serving_default"](input_ids=tf.constant(io["input_ids"]))["logits"].numpy()
diff = float(np.abs(got - io["logits"]).max())
agree = float((got.argmax(1) == io["logits"].argmax(1)).mean())
print(json.dumps({"tf_version": tf.__version__, "tf_tensors": len(names), "mismatched": mismatched,
                  "missing": missing, "savedmodel_max_abs_logit_diff": diff, "argmax_agreement": agree}))
"""


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a BERT-family hf_classifier checkpoint or <run>/<best>")  # fmt: skip
    ap.add_argument("--texts", type=int, default=100, help="dev texts whose logits are compared")
    ap.add_argument("--tf-python", default=sys.executable, help="an interpreter with TensorFlow")
    ap.add_argument("--out", help="where the export goes (default: a temporary directory)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from xdpx.batching import pad_ids
    from xdpx.checkpoint import load_checkpoint
    from xdpx.config import PreproConfig
    from xdpx.data import Encoder, PreparedMeta
    from xdpx.data.readers import read_examples
    from xdpx.inference import as_samples, call_model
    from xdpx.pretrained import hf_state
    from xdpx.tf_checkpoint import export_google_bert, hf_to_google

    out = args.out or tempfile.mkdtemp(prefix="xdpx-tf-")
    exported = export_google_bert(args.checkpoint, f"{out}/tf")
    ckpt = load_checkpoint(args.checkpoint)
    np.savez(f"{out}/expected.npz", **{k.replace("/", "|"): v for k, v in hf_to_google(hf_state(ckpt.path)).items()})  # fmt: skip
    encoder = Encoder.from_dir(ckpt.path)
    if encoder.pad_id != 0:
        raise SystemExit(f"{ckpt.path}: padding id {encoder.pad_id}: the SavedModel masks id 0 (BERT's)")  # fmt: skip
    prepro = PreproConfig(**PreparedMeta.read(ckpt.path).prepro)
    dev = f"{prepro.data_source}/{prepro.data_files['dev']}"
    texts = read_examples(dev, prepro).texts[: args.texts]
    ids = pad_ids(as_samples(*encoder.encode_inputs(texts)), 0)
    with torch.inference_mode():
        logits = call_model(ckpt.model.eval(), torch.from_numpy(ids)).float().numpy()
    np.savez(f"{out}/logits.npz", input_ids=ids, logits=logits)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([args.tf_python, "-c", TF_SIDE, out], capture_output=True, text=True, env=env, timeout=1800)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the TensorFlow side failed ({args.tf_python}):\n{done.stderr[-3000:]}")
    tf_side = json.loads(done.stdout.strip().splitlines()[-1])
    report = {
        "checkpoint": exported["checkpoint"],
        "tensors_written": exported["tensors"],
        **tf_side,
        "every_tensor_equal": not tf_side["mismatched"] and not tf_side["missing"],
        "texts": len(texts),
        "dev_file": dev,
        "out": out,
    }
    print(json.dumps({k: report[k] for k in ("tensors_written", "tf_tensors", "every_tensor_equal", "savedmodel_max_abs_logit_diff", "argmax_agreement", "tf_version")}))  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
