"""KServe V2 JSON tensor data, request and response side, against the code it replaced.

Request side: each body is turned into tensor bytes by
  - ``baseline``: orjson reads the whole header, then each input's ``data`` is
    flattened, the type of every element checked and numpy converts them (a copy
    of ``gateway/json_tensors.py`` as it was, kept below);
  - ``ferry``: ``gateway.json_lift.load_lifted`` then ``gateway.json_tensors.json_bytes``,
    as ``parse_infer_request`` does: a large array whose text shows it holds numbers
    only is read on its own, and the per-element type check is skipped.
Both must give the same bytes (checked before timing). The rest of
``parse_infer_request`` (names, shapes, limits) is the same for both and left out.

Response side: a 600 KB FP32 output written as JSON from a per-element list
(``tolist()``) and from the ndarray that ``render_infer_response`` hands orjson.

Rounds alternate the candidates and the order they run in, so drift on a shared
machine falls on all alike. Times are CPU time per call (``time.process_time``),
medians over the rounds; the speed-up is the median of the rounds' own ratios,
and ``best/best`` divides the fastest rounds.

    python benchmarks/bench_json.py            # 40 rounds, about 30 s
    python benchmarks/bench_json.py --quick    # 3 rounds
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import orjson

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script, benchmarks/ is on the path but not the repository
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.table import Column, print_table  # noqa: E402
from gateway.json_lift import load_lifted  # noqa: E402
from gateway.json_tensors import json_bytes  # noqa: E402
from workers.datatypes import element_count, numpy_dtype  # noqa: E402

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "json.json"
TARGET_S = 0.02  # each timing runs calls for about this long
COLUMNS = (Column("case", 40, align="<"), Column("KB", 6, ".0f"), Column("baseline us", 12, ".1f"),
           Column("ferry us", 9, ".1f"), Column("speed-up", 9, ".2f"), Column("best/best", 10, ".2f"))


# -- the baseline: gateway/json_tensors.py before the lifted path, errors simplified --

_INTEGERS = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"})
_TYPES: dict[str, frozenset[type]] = {"BOOL": frozenset({bool}), "BYTES": frozenset({str}),
                                      **{name: frozenset({int}) for name in _INTEGERS},
                                      **{name: frozenset({int, float}) for name in ("FP16", "FP32", "FP64")}}


def baseline_bytes(name: str, datatype: str, shape: tuple[int, ...], data: list[Any]) -> bytes:
    where = f"input '{name}'"  # as the original, which named the input in its errors
    flat = data
    while flat and type(flat[0]) is list:
        if set(map(type, flat)) != {list}:
            raise ValueError(f"{where}: mixed nesting")
        flat = list(itertools.chain.from_iterable(flat))
    if len(flat) != element_count(shape) or set(map(type, flat)) - _TYPES[datatype]:
        raise ValueError(f"{where}: wrong count or type")
    dtype = numpy_dtype(datatype)
    if datatype in _INTEGERS:
        info = np.iinfo(dtype)
        wide = np.array(flat, dtype=np.uint64 if datatype == "UINT64" else np.int64)
        if wide.size and (wide.min() < info.min or wide.max() > info.max):
            raise ValueError(f"{where}: out of range")
        return wide.astype(dtype).tobytes()
    with np.errstate(over="ignore"):
        array = np.array(flat, dtype=dtype)
    if not np.isfinite(array).all():
        raise ValueError(f"{where}: out of range")
    return array.tobytes()


def baseline(body: bytes) -> list[bytes]:
    header = orjson.loads(body)
    return [baseline_bytes(item["name"], item["datatype"], tuple(item["shape"]), item["data"])
            for item in header["inputs"]]


def ferry(body: bytes) -> list[bytes]:
    header = load_lifted(body, len(body)) or orjson.loads(body)
    return [json_bytes(item["name"], item["datatype"], tuple(item["shape"]), item["data"])
            for item in header["inputs"]]


# -- the bodies ------------------------------------------------------------------

def _body(array: np.ndarray, datatype: str, nested: bool = True, dumps: Callable[[Any], bytes] = orjson.dumps) -> bytes:
    data = array.tolist() if nested else array.reshape(-1).tolist()
    shape = list(array.shape)
    return dumps({"inputs": [{"name": "INPUT0", "shape": shape, "datatype": datatype, "data": data}],
                  "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]})


def request_cases() -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(17)
    image = rng.random((1, 3, 80, 128), dtype=np.float32)
    return [
        ("FP32 [1,3,38,38] nested, orjson", _body(image[:, :, :38, :38], "FP32")),
        ("FP32 [1,3,80,128] nested, orjson", _body(image, "FP32")),
        ("FP32 [30720] flat, json.dumps", _body(image.reshape(-1), "FP32",
                                                dumps=lambda value: json.dumps(value).encode())),
        ("FP16 [1,3,80,128] nested, orjson", _body(image.astype(np.float16), "FP16")),
        ("INT64 [1,40000] token ids", _body(rng.integers(0, 30522, (1, 40000)), "INT64")),
        ("FP32 [16]", _body(rng.standard_normal(16).astype(np.float32), "FP32")),
    ]


# -- timing ----------------------------------------------------------------------

def per_call_s(function: Callable[[bytes], Any], body: bytes, calls: int) -> float:
    """CPU seconds per call: this process's CPU time, which time spent waiting for a
    core on a busy machine does not inflate as it does the wall clock."""
    start = time.process_time()
    for _ in range(calls):
        function(body)
    return (time.process_time() - start) / calls


def calls_for(function: Callable[[bytes], Any], body: bytes) -> int:
    once = per_call_s(function, body, 3)
    return max(3, int(TARGET_S / max(once, 1e-7)))


def measure(candidates: dict[str, Callable[[bytes], Any]], body: bytes, rounds: int) -> dict[str, list[float]]:
    calls = {name: calls_for(function, body) for name, function in candidates.items()}
    times: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for round_index in range(rounds):
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for name in order:
            times[name].append(per_call_s(candidates[name], body, calls[name]))
    return times


def row(case: str, size: int, times: dict[str, list[float]], old: str, new: str) -> dict[str, Any]:
    """Medians, and the speed-up as the median of each round's ratio: the two run back to
    back in a round, so a spike of load elsewhere moves one round, not the figure."""
    base, fast = statistics.median(times[old]), statistics.median(times[new])
    ratios = [old_s / new_s for old_s, new_s in zip(times[old], times[new], strict=True)]
    return {"case": case, "kb": size / 1000, f"{old}_us": base * 1e6, f"{new}_us": fast * 1e6,
            "speedup": statistics.median(ratios), "best_ratio": min(times[old]) / min(times[new]),
            f"{old}_us_all": [t * 1e6 for t in times[old]], f"{new}_us_all": [t * 1e6 for t in times[new]]}


def request_rows(rounds: int) -> list[dict[str, Any]]:
    rows = []
    for case, body in request_cases():
        if baseline(body) != ferry(body):
            raise SystemExit(f"{case}: ferry's tensor bytes differ from the baseline's")
        times = measure({"baseline": baseline, "ferry": ferry}, body, rounds)
        rows.append(row(case, len(body), times, "baseline", "ferry"))
        print(f"  {case}: done", flush=True)
    return rows


def response_row(rounds: int) -> dict[str, Any]:
    array = np.random.default_rng(17).random(30720, dtype=np.float32)
    size = len(orjson.dumps(array, option=orjson.OPT_SERIALIZE_NUMPY))
    times = measure({"tolist": lambda _: orjson.dumps(array.tolist()),
                     "ndarray": lambda _: orjson.dumps(array, option=orjson.OPT_SERIALIZE_NUMPY)}, b"", rounds)
    return row("render FP32 [30720] output", size, times, "tolist", "ndarray")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="3 rounds, for a smoke run")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    print(f"JSON tensor data, {rounds} alternating rounds; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs", flush=True)
    rows = request_rows(rounds)
    print()
    print_table(COLUMNS, [[r["case"], r["kb"], r["baseline_us"], r["ferry_us"], r["speedup"], r["best_ratio"]]
                          for r in rows])
    render = response_row(rounds)
    print(f"\nresponse: {render['case']} ({render['kb']:.0f} KB from the ndarray): per-element list "
          f"{render['tolist_us']:.0f} us, ndarray {render['ndarray_us']:.0f} us "
          f"(x{render['speedup']:.2f}, best/best x{render['best_ratio']:.2f}; "
          f"render_infer_response already uses the ndarray)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "json", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg(), "python": platform.python_version(),
                    "numpy": np.__version__, "orjson": orjson.__version__},
        "settings": {"rounds": rounds, "target_s_per_timing": TARGET_S},
        "request": rows, "response": render,
    }, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
