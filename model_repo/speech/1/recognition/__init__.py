"""The speech model's recognizer, which model.py loads by path (ferry's Python backend
puts no model folder on sys.path), so its modules import one another relatively.

    settings    the fixed framing and the config's parameters
    state       a session between steps, and its bytes in STATE_IN / STATE_OUT
    detection   is a frame speech? A level detector whose state is one number
    decoders    PocketSphinx decoders pooled among sessions
    recognizer  one step of one session: detect, decode, end utterances
"""

from .recognizer import Recognizer, Result
from .settings import SAMPLE_RATE, Settings

__all__ = ["SAMPLE_RATE", "Recognizer", "Result", "Settings"]
