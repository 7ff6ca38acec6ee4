"""Builds the TensorFlow test models and TensorFlow's own answers, in a process of its own:
TensorFlow and PyTorch (whose triton it imports) abort when both load into one process, and
the test run imports PyTorch.

    python -m tests.tf_models <repository> <rows.npy> <expected.npy>
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def build(root: Path, rows_path: Path, expected_path: Path) -> None:
    import keras
    import tensorflow as tf

    class Lengths(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def lengths(self, text):  # type: ignore[no-untyped-def]
            return {"length": tf.strings.length(text), "upper": tf.strings.upper(text)}

    keras.utils.set_random_seed(5)
    features = keras.Input(shape=(4,), name="features")
    hidden = keras.layers.Dense(8, activation="relu")(features)
    scores = keras.layers.Dense(3, name="scores")(hidden)
    saved = root / "keras_dense/1/model.savedmodel"
    keras.Model(features, scores).export(str(saved), format="tf_saved_model", verbose=False)
    # Only the platform: inputs, outputs, max_batch_size and batching come from the signature.
    (root / "keras_dense/config.pbtxt").write_text('name: "keras_dense"\nplatform: "tensorflow_savedmodel"\n')
    module = Lengths()
    tf.saved_model.save(module, str(root / "text/1/model.savedmodel"),
                        signatures={"by_length": module.lengths.get_concrete_function()})
    (root / "text/config.pbtxt").write_text('name: "text"\nplatform: "tensorflow_savedmodel"\nmax_batch_size: 0\n'
                                            'parameters [ { key: "TF_SIGNATURE_DEF" value: { string_value: '
                                            '"by_length" } } ]\n')
    rows = np.load(rows_path)
    direct = tf.saved_model.load(str(saved)).signatures["serving_default"]
    np.save(expected_path, direct(features=tf.constant(rows))["output_0"].numpy())


if __name__ == "__main__":
    build(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
