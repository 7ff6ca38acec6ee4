"""minilm_tokenizer: UTF-8 text to all-MiniLM-L6-v2's token ids.

TEXT (BYTES [1]) -> INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS (INT64 [-1]),
each row padded to the longest text of the batch, truncated at the config's
``max_length`` parameter (256 tokens, the model's max_seq_length). The
tokenizer is the model's own tokenizer.json, which
model_repo/convert_minilm.py copies next to this file.
"""

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer


class Model:
    def load(self, context):
        path = Path(context.version_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run python model_repo/convert_minilm.py")
        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.enable_truncation(int(context.parameters.get("max_length", "256")))
        self._tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")

    def infer(self, inputs):
        texts = []
        for index, element in enumerate(np.asarray(inputs["TEXT"], dtype=object).reshape(-1)):
            try:
                texts.append(bytes(element).decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise ValueError(f"input 'TEXT' row {index} is not valid UTF-8: {exc.reason} "
                                 f"at byte {exc.start}") from None
        encodings = self._tokenizer.encode_batch(texts)
        return {
            "INPUT_IDS": np.array([e.ids for e in encodings], dtype=np.int64),
            "ATTENTION_MASK": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "TOKEN_TYPE_IDS": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }

    def unload(self):
        self._tokenizer = None
