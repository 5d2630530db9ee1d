"""A TensorFlow SavedModel of a BERT classifier from a Google-format checkpoint (what ``xdpx
export-tf --savedmodel`` writes after the checkpoint), for TF Serving.

The graph is BERT's forward pass (Devlin et al. 2019; google-research/bert ``modeling.py``)
written with TensorFlow ops over the checkpoint's variables, as transformers'
``BertForSequenceClassification`` computes it (the model xdpx fine-tuned), so its logits
equal the PyTorch model's to float32 rounding:

- ``attention_mask = input_ids != 0`` (BERT's padding id, as xdpx's ONNX graph derives it),
  ``token_type_ids`` 0, positions ``0..seq_len-1``;
- embeddings (word + position + token type) and LayerNorm (epsilon ``layer_norm_eps``,
  1e-12 as BERT's);
- per layer: self-attention (``num_attention_heads`` heads, scores scaled by
  ``1/sqrt(head size)``, padded keys masked out), output dense + residual + LayerNorm, the
  intermediate dense with ``hidden_act`` (``gelu``: the exact erf form, transformers'
  meaning; ``gelu_new``: the tanh approximation, Google's original), output dense + residual +
  LayerNorm;
- the pooler (``tanh`` of a dense of the first token) and ``output_weights`` / ``output_bias``.

Signature ``serving_default``: ``input_ids`` ``[batch, seq_len]`` int64 -> ``logits``
``[batch, num_labels]`` float32. Needs TensorFlow (``pip install 'xdpx[tf]'``); imports
nothing of xdpx's but this file, so it also runs in a TensorFlow-only environment
(``python -m xdpx.tf_savedmodel CHECKPOINT_DIR OUT``).
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

__all__ = ["build_saved_model"]


def build_saved_model(checkpoint_dir: str, out_dir: str) -> str:
    """Write the SavedModel of the BERT classifier in ``checkpoint_dir`` (``bert_config.json``
    and ``bert_model.ckpt.*``, e.g. :func:`xdpx.tf_checkpoint.export_google_bert`'s output) to
    ``out_dir``.

    Returns:
        ``out_dir``.

    Raises:
        ImportError: TensorFlow is not installed.
        KeyError: the checkpoint lacks a BERT variable or the classifier head.
    """
    import numpy as np
    import tensorflow as tf

    with open(os.path.join(checkpoint_dir, "bert_config.json"), encoding="utf-8") as f:
        config: dict[str, Any] = json.load(f)
    reader = tf.train.load_checkpoint(os.path.join(checkpoint_dir, "bert_model.ckpt"))
    layers, heads = int(config["num_hidden_layers"]), int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    eps = float(config.get("layer_norm_eps", 1e-12))
    approximate = config.get("hidden_act", "gelu") in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")

    class Bert(tf.Module):
        def __init__(self) -> None:
            super().__init__(name="bert_classifier")
            self.w = {
                name: tf.Variable(reader.get_tensor(name), trainable=False, name=name.replace("/", "__"))
                for name in reader.get_variable_to_shape_map()
                if name.startswith("bert/") or name.startswith("output_")
            }  # fmt: skip

        def norm(self, x: Any, prefix: str) -> Any:
            mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
            return (x - mean) * tf.math.rsqrt(var + eps) * self.w[f"{prefix}/gamma"] + self.w[f"{prefix}/beta"]  # fmt: skip

        def dense(self, x: Any, prefix: str) -> Any:
            return tf.matmul(x, self.w[f"{prefix}/kernel"]) + self.w[f"{prefix}/bias"]

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64, name="input_ids")])
        def serve(self, input_ids: Any) -> dict[str, Any]:
            shape = tf.shape(input_ids)
            b, t = shape[0], shape[1]
            mask = tf.cast(tf.not_equal(input_ids, 0), tf.float32)  # [B, T]
            x = tf.gather(self.w["bert/embeddings/word_embeddings"], input_ids)
            x += self.w["bert/embeddings/position_embeddings"][None, :t]
            x += self.w["bert/embeddings/token_type_embeddings"][0]
            x = self.norm(x, "bert/embeddings/LayerNorm")
            d = hidden // heads
            bias = (1.0 - mask)[:, None, None, :] * tf.float32.min  # padded keys
            for i in range(layers):
                p = f"bert/encoder/layer_{i}"

                def split(y: Any) -> Any:
                    return tf.transpose(tf.reshape(y, [b, t, heads, d]), [0, 2, 1, 3])

                q = split(self.dense(x, f"{p}/attention/self/query"))
                k = split(self.dense(x, f"{p}/attention/self/key"))
                v = split(self.dense(x, f"{p}/attention/self/value"))
                scores = tf.matmul(q, k, transpose_b=True) / math.sqrt(d) + bias
                ctx = tf.matmul(tf.nn.softmax(scores, axis=-1), v)
                ctx = tf.reshape(tf.transpose(ctx, [0, 2, 1, 3]), [b, t, hidden])
                x = self.norm(self.dense(ctx, f"{p}/attention/output/dense") + x, f"{p}/attention/output/LayerNorm")  # fmt: skip
                inner = tf.nn.gelu(self.dense(x, f"{p}/intermediate/dense"), approximate=approximate)  # fmt: skip
                x = self.norm(self.dense(inner, f"{p}/output/dense") + x, f"{p}/output/LayerNorm")
            pooled = tf.tanh(self.dense(x[:, 0], "bert/pooler/dense"))
            logits = tf.matmul(pooled, self.w["output_weights"], transpose_b=True) + self.w["output_bias"]  # fmt: skip
            return {"logits": logits}

    model = Bert()
    for key in ("output_weights", "output_bias", "bert/pooler/dense/kernel"):
        if key not in model.w:
            raise KeyError(f"{checkpoint_dir}: no {key} in the checkpoint: a fine-tuned BERT classifier has one")  # fmt: skip
    model.serve(np.zeros((1, 2), np.int64))  # trace once before saving
    tf.saved_model.save(model, out_dir, signatures={"serving_default": model.serve})
    return out_dir


if __name__ == "__main__":
    print(build_saved_model(sys.argv[1], sys.argv[2]))
