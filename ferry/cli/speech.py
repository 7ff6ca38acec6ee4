"""``ferry speech``: stream a WAV file to the speech model over Redis and print
transcripts as they arrive.

    ferry speech --broker redis://127.0.0.1:6379/0 hello.wav

Partials overwrite one line; each final utterance gets a line of its own,
with the span of audio it covers and how long after its last chunk was sent
it arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TextIO

from broker import channels
from ferry.speech_client import SpeechError, SpeechSession, Transcript, read_wav, stream_samples


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    speech = commands.add_parser("speech", help="stream a WAV file to a speech model over Redis, printing "
                                                "partial and final transcripts live")
    speech.add_argument("wav", type=Path, help="16 kHz mono 16-bit PCM WAV file")
    speech.add_argument("--broker", required=True, help="the fleet's Redis: redis://HOST:PORT/DB")
    speech.add_argument("--model", default="speech")
    speech.add_argument("--chunk-ms", type=int, default=160, help="audio per message (100-320 ms is typical)")
    speech.add_argument("--no-realtime", dest="realtime", action="store_false",
                        help="send as fast as possible instead of at the pace of speech")
    speech.add_argument("--channel-prefix", default=channels.PREFIX)


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    try:
        samples = read_wav(args.wav)
        return asyncio.run(_session(args, samples, out))
    except (SpeechError, OSError) as exc:
        print(f"ferry speech: {exc}", file=sys.stderr)
        return 1


async def _session(args: argparse.Namespace, samples: object, out: TextIO) -> int:
    async with SpeechSession(args.broker, args.model, prefix=args.channel_prefix) as session:
        sender = asyncio.create_task(stream_samples(session, samples, args.chunk_ms, args.realtime))  # type: ignore[arg-type]
        failed = False
        async for transcript in session.transcripts():
            failed |= bool(transcript.error)
            _show(transcript, session, out)
            if sender.done() and sender.exception() is not None:
                raise sender.exception()  # type: ignore[misc]
        await sender
    return 1 if failed else 0


def _show(transcript: Transcript, session: SpeechSession, out: TextIO) -> None:
    if transcript.error:
        print(f"\nchunk {transcript.chunk}: error: {transcript.error}", file=out, flush=True)
        return
    span = f"{transcript.start_ms / 1000:6.2f}-{transcript.end_ms / 1000:6.2f}s"
    lag_ms = (transcript.received_s - session.sent_at(transcript.chunk)) * 1000
    if transcript.final:
        if transcript.text:
            print(f"\r[{span}] {transcript.text}  ({lag_ms:.0f} ms)\033[K", file=out, flush=True)
    elif transcript.text:
        print(f"\r[{span}] {transcript.text} ...\033[K", end="", file=out, flush=True)
