"""minilm_pooling: token embeddings to one unit-length sentence embedding.

TOKEN_EMBEDDINGS (FP32 [-1, 384]), ATTENTION_MASK (INT64 [-1]) -> EMBEDDING
(FP32 [384]): the mean of the embeddings of the tokens the mask keeps, then
L2-normalised, as sentence-transformers' Pooling and Normalize modules do.
"""

import numpy as np


class Model:
    def load(self, context):
        pass

    def infer(self, inputs):
        tokens = np.asarray(inputs["TOKEN_EMBEDDINGS"], dtype=np.float32)
        mask = np.asarray(inputs["ATTENTION_MASK"])
        if tokens.shape[:2] != mask.shape:
            raise ValueError(f"TOKEN_EMBEDDINGS {list(tokens.shape)} and ATTENTION_MASK {list(mask.shape)} "
                             "disagree on batch and sequence length")
        return {"EMBEDDING": pool(tokens, mask)}

    def unload(self):
        pass


def pool(tokens, mask):
    weights = mask.astype(np.float32)[:, :, None]
    summed = (tokens * weights).sum(axis=1)
    counts = np.clip(weights.sum(axis=1), 1e-9, None)
    mean = summed / counts
    norms = np.clip(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12, None)
    return (mean / norms).astype(np.float32)
