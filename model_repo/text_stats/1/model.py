"""text_stats: upper-cases UTF-8 text and counts its unicode characters.

TEXT (BYTES [1]) -> UPPER (BYTES [1], UTF-8), LENGTH (INT32 [1], code points).
Written by hand; model_repo/generate.py copies it into each repository it writes.
"""

import numpy as np


def _decode(element):
    return bytes(element).decode("utf-8")


def _upper_utf8(text):
    return text.upper().encode("utf-8")


# Element-wise ufuncs over object arrays; numpy's fixed-width string dtypes
# would drop trailing NULs and cannot grow a string that upper-casing
# lengthens ("\u00df" -> "SS").
_DECODE = np.frompyfunc(_decode, 1, 1)
_UPPER_UTF8 = np.frompyfunc(_upper_utf8, 1, 1)
_LENGTH = np.frompyfunc(len, 1, 1)


class Model:
    def load(self, context):
        pass

    def infer(self, inputs):
        text = np.asarray(inputs["TEXT"], dtype=object)
        try:
            decoded = _DECODE(text)
        except UnicodeDecodeError as exc:
            raise ValueError(f"input 'TEXT' is not valid UTF-8: {exc.reason} at byte {exc.start}") from None
        upper = np.asarray(_UPPER_UTF8(decoded), dtype=object)
        length = np.asarray(_LENGTH(decoded), dtype=object).astype(np.int32)
        return {"UPPER": upper, "LENGTH": length}

    def unload(self):
        pass
