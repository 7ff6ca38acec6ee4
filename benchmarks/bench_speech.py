"""How many real-time speech sessions one machine sustains, over Redis.

    python benchmarks/bench_speech.py               # 1, 2, 4, 8, 12, 16 sessions, a few minutes
    python benchmarks/bench_speech.py --quick       # 1 and 4 sessions
    python benchmarks/bench_speech.py --quick --baseline --instances 4
                                                    # the same, instances in the worker's process first
    python benchmarks/bench_speech.py --quick --second-pass-pace 1000
                                                    # each final's second pass all in its endpoint's step

A ``redis-server`` and ``ferry worker`` processes serve a copy of ``model_repo/speech``;
``--instances`` sets its ``instance_group`` count, and ``--instance-process no`` keeps the
instances in the worker's process (a baseline: they share one GIL) instead of one process
each.
For each count N, N clients (``ferry.speech_client.SpeechSession``) each stream the
same ~9 s of espeak-ng speech (three sentences with pauses) in 160 ms chunks at the pace
of speech, starting a fraction of a chunk apart. Per count it reports:

- **RTF per session**: the workers' CPU seconds over the run (from /proc, their instance
  processes included) divided by
  the seconds of audio all N sessions sent: the compute one session costs per second
  of speech. A machine with C cores can at best hold C / RTF sessions.
- **partial p50/p95 ms**: for each chunk answered with a partial transcript, from the
  chunk being sent (it is on Redis at once) to the partial covering it arriving.
- **final p95 ms**: the same for chunks answered with a final transcript (a final is
  decoded a second time, over the chunks after its utterance ends, so the chunk that
  carries it came later than the speech it covers).
- **keeps up**: p95 partial latency under ``--max-p95-ms`` (default 500).

The figures are ratios and latencies measured within one run; the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import cpu, fleet_procs  # noqa: E402
from benchmarks.stats import int_list, percentile  # noqa: E402
from ferry.speech_client import SpeechSession, Transcript, stream_samples  # noqa: E402
from tests.speech.audio import silence, speak  # noqa: E402

SENTENCES = ("please open the door", "i would like a cup of coffee", "two three four five")
CHUNK_MS = 160
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "speech.json"


def speech_audio(cache: Path) -> np.ndarray:
    parts = [silence(300)]
    for sentence in SENTENCES:
        parts += [speak(sentence, cache), silence(1000)]
    return np.concatenate(parts)


async def one_session(url: str, samples: np.ndarray, delay_s: float) -> list[tuple[Transcript, float]]:
    await asyncio.sleep(delay_s)
    async with SpeechSession(url) as session:
        sender = asyncio.create_task(stream_samples(session, samples, CHUNK_MS))
        got = [(t, t.received_s - session.sent_at(t.chunk)) async for t in session.transcripts(timeout_s=120)]
        await sender
    return got


async def run_sessions(url: str, samples: np.ndarray, count: int) -> list[list[tuple[Transcript, float]]]:
    rng = random.Random(count)
    return await asyncio.gather(*(one_session(url, samples, rng.uniform(0, CHUNK_MS / 1000))
                                  for _ in range(count)))


def measure(url: str, worker_pids: tuple[int, ...], samples: np.ndarray, count: int) -> dict[str, object]:
    before = cpu.tree_cpu_s(worker_pids) or 0.0
    began = time.monotonic()
    sessions = asyncio.run(run_sessions(url, samples, count))
    elapsed = time.monotonic() - began
    worker_cpu = (cpu.tree_cpu_s(worker_pids) or 0.0) - before
    audio_s = len(samples) / 16_000
    partial = sorted(lag for s in sessions for t, lag in s if not t.final and not t.error)
    final = sorted(lag for s in sessions for t, lag in s if t.final and not t.error)
    errors = sum(1 for s in sessions for t, _ in s if t.error)
    return {
        "sessions": count, "audio_s": audio_s, "elapsed_s": elapsed, "errors": errors,
        "rtf_per_session": worker_cpu / (count * audio_s),
        "partial_p50_ms": (percentile(partial, 0.5) or 0) * 1e3,
        "partial_p95_ms": (percentile(partial, 0.95) or 0) * 1e3,
        "final_p95_ms": (percentile(final, 0.95) or 0) * 1e3,
        "finals": [" | ".join(t.text for t, _ in s if t.final and t.text) for s in sessions[:1]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int_list, default=(1, 2, 4, 8, 12, 16))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-p95-ms", type=float, default=500.0)
    parser.add_argument("--instances", type=int, default=0, help="instance_group count (default: the config's)")
    parser.add_argument("--second-pass-pace", type=int, default=0,
                        help="the model's second_pass_pace (default: the config's); 1000 hears a whole "
                             "utterance again in the step that ends it")
    parser.add_argument("--instance-process", choices=("yes", "no"), default="yes",
                        help="each instance in a process of its own (yes), or all in the worker's (no)")
    parser.add_argument("--baseline", action="store_true",
                        help="first measure the instances in the worker's process, in the same run")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    counts = (1, 4) if args.quick else args.sessions
    modes = (args.instance_process,)
    if args.baseline and args.instance_process == "yes":
        modes = ("no", "yes")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ferry-speech-") as tmp:
        root = Path(tmp)
        samples = speech_audio(root)
        with fleet_procs.redis_server() as broker:
            for mode in modes:
                rows += run_mode(root / f"process-{mode}", broker, samples, counts, mode, args)
    summary = {mode: max((r["sessions"] for r in rows if r["keeps_up"] and r["instance_process"] == mode), default=0)
               for mode in modes}
    for mode, sustained in summary.items():
        print(f"sustained: {sustained} concurrent real-time sessions with {args.workers} worker(s), instance "
              f"process {mode} (p95 partial latency <= {args.max_p95_ms:.0f} ms)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"workers": args.workers, "instances": args.instances or "config",
                                    "second_pass_pace": args.second_pass_pace or "config",
                                    "chunk_ms": CHUNK_MS, "rows": rows, "sustained_sessions": summary}, indent=2))
    print(f"wrote {args.out}")
    return 0


def run_mode(root: Path, broker: fleet_procs.Broker, samples: np.ndarray, counts: tuple[int, ...], mode: str,
             args: argparse.Namespace) -> list[dict[str, object]]:
    shutil.copytree(REPO_ROOT / "model_repo" / "speech", root / "repo" / "speech")
    configure(root / "repo" / "speech" / "config.pbtxt", args.instances, mode, args.second_pass_pace)
    rows = []
    url = fleet_procs.fresh_url(broker)
    with fleet_procs.fleet(root / "repo", url, args.workers, "speech", root) as fleet:
        for count in counts:
            row = {"instance_process": mode, **measure(url, fleet.worker_pids, samples, count)}
            row["keeps_up"] = row["errors"] == 0 and row["partial_p95_ms"] <= args.max_p95_ms  # type: ignore[operator]
            rows.append(row)
            print_row(row)
    return rows


def configure(config: Path, instances: int, instance_process: str, second_pass_pace: int = 0) -> None:
    """The copy's instance count and second_pass_pace, when given, and FERRY_INSTANCE_PROCESS."""
    text = config.read_text()
    if instances:
        text, found = re.subn(r"instance_group \[ \{ count: \d+", f"instance_group [ {{ count: {instances}", text)
        assert found == 1, f"no instance_group count in {config}"
    if second_pass_pace:
        text, found = re.subn(r'(key: "second_pass_pace" value: \{ string_value: )"\d+"',
                              rf'\1"{second_pass_pace}"', text)
        assert found == 1, f"no second_pass_pace in {config}"
    parameter = f'{{ key: "FERRY_INSTANCE_PROCESS" value: {{ string_value: "{instance_process}" }} }},'
    assert "parameters [\n" in text, f"no parameters in {config}"
    config.write_text(text.replace("parameters [\n", f"parameters [\n  {parameter}\n", 1))


def print_row(row: dict[str, object]) -> None:
    if not hasattr(print_row, "header"):
        print(f"{'process':>7} {'sessions':>8} {'RTF/session':>11} {'partial p50':>11} {'partial p95':>11} "
              f"{'final p95':>9} {'errors':>6} {'keeps up':>8}")
        print_row.header = True  # type: ignore[attr-defined]
    print(f"{row['instance_process']:>7} {row['sessions']:>8} {row['rtf_per_session']:>11.3f} "
          f"{row['partial_p50_ms']:>11.0f} "
          f"{row['partial_p95_ms']:>11.0f} {row['final_p95_ms']:>9.0f} {row['errors']:>6} "
          f"{'yes' if row['keeps_up'] else 'no':>8}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
