"""Write the tiny Google-format BERT checkpoint of tests/test_tf_checkpoint.py with TensorFlow
itself (run once, with TensorFlow installed; the outputs are committed):

    pip install tensorflow-cpu==2.21.0
    python tests/data/tf_bert/make_fixture.py tests/data/tf_bert

Writes, into the directory given:

- ``bert_model.ckpt.index``, ``bert_model.ckpt.data-00000-of-00001``: a TF1 ``Saver``
  checkpoint (``tf.compat.v1.train.Saver``, the writer of Google's BERT releases) of a BERT
  with 2 layers, hidden size 32, 2 heads, a 3-class classifier head (``output_weights``,
  ``output_bias``, as ``run_classifier.py`` names them), the pre-training heads (``cls/...``),
  Adam's slots (``.../adam_m``, ``.../adam_v``) and ``global_step``, all drawn at random
  (seed 0) in TensorFlow;
- ``bert_config.json``, ``vocab.txt`` (Google's layout);
- ``values.npz``: every variable's value as TensorFlow holds it (``session.run``), and
  ``tf_version.txt``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

CONFIG = {
    "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 64,
    "max_position_embeddings": 64, "num_attention_heads": 2, "num_hidden_layers": 2,
    "type_vocab_size": 2, "vocab_size": 0,
}  # fmt: skip
WORDS = "the a good bad film movie very not is was great awful plot acting 好 很 不 电 影 的 了 我 喜 欢 差".split()  # fmt: skip


def shapes(h: int, inter: int, vocab: int, layers: int, labels: int) -> dict[str, tuple[int, ...]]:
    out = {
        "bert/embeddings/word_embeddings": (vocab, h),
        "bert/embeddings/token_type_embeddings": (2, h),
        "bert/embeddings/position_embeddings": (CONFIG["max_position_embeddings"], h),
        "bert/embeddings/LayerNorm/beta": (h,),
        "bert/embeddings/LayerNorm/gamma": (h,),
    }
    for i in range(layers):
        p = f"bert/encoder/layer_{i}"
        for part in ("query", "key", "value"):
            out[f"{p}/attention/self/{part}/kernel"] = (h, h)
            out[f"{p}/attention/self/{part}/bias"] = (h,)
        out[f"{p}/attention/output/dense/kernel"] = (h, h)
        out[f"{p}/attention/output/dense/bias"] = (h,)
        out[f"{p}/attention/output/LayerNorm/beta"] = (h,)
        out[f"{p}/attention/output/LayerNorm/gamma"] = (h,)
        out[f"{p}/intermediate/dense/kernel"] = (h, inter)
        out[f"{p}/intermediate/dense/bias"] = (inter,)
        out[f"{p}/output/dense/kernel"] = (inter, h)
        out[f"{p}/output/dense/bias"] = (h,)
        out[f"{p}/output/LayerNorm/beta"] = (h,)
        out[f"{p}/output/LayerNorm/gamma"] = (h,)
    out["bert/pooler/dense/kernel"] = (h, h)
    out["bert/pooler/dense/bias"] = (h,)
    out["cls/predictions/transform/dense/kernel"] = (h, h)
    out["cls/predictions/output_bias"] = (vocab,)
    out["cls/seq_relationship/output_weights"] = (2, h)
    out["output_weights"] = (labels, h)
    out["output_bias"] = (labels,)
    return out


def main(out_dir: str) -> None:
    out = Path(out_dir)
    vocab = ["[PAD]", *[f"[unused{i}]" for i in range(3)], "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]  # fmt: skip
    config = {**CONFIG, "vocab_size": len(vocab)}
    tf.compat.v1.disable_eager_execution()
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        variables = {}
        for name, shape in shapes(32, 64, len(vocab), 2, 3).items():
            init = tf.compat.v1.truncated_normal_initializer(stddev=0.02)
            if name.endswith(("gamma",)):
                init = tf.compat.v1.random_uniform_initializer(0.9, 1.1)
            variables[name] = tf.compat.v1.get_variable(name, shape, tf.float32, init)
            if not name.startswith("cls/"):
                for slot in ("adam_m", "adam_v"):
                    variables[f"{name}/{slot}"] = tf.compat.v1.get_variable(f"{name}/{slot}", shape, tf.float32, tf.compat.v1.random_uniform_initializer(0, 1e-3))  # fmt: skip
        step = tf.compat.v1.get_variable("global_step", [], tf.int64, tf.compat.v1.constant_initializer(1234))  # fmt: skip
        variables["global_step"] = step
        saver = tf.compat.v1.train.Saver(var_list=variables)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            values = sess.run(variables)
            saver.save(sess, str(out / "bert_model.ckpt"), write_meta_graph=False, write_state=False)  # fmt: skip
    np.savez(out / "values.npz", **{k.replace("/", "|"): v for k, v in values.items()})
    (out / "bert_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (out / "tf_version.txt").write_text(tf.__version__ + "\n")
    print(f"wrote {len(values)} variables with TensorFlow {tf.__version__} to {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent))
