"""Write ferry's example model repository, deterministically.

    python model_repo/generate.py [--out DIR]

writes ``add_sub``, ``cnn``, ``stateful_gru`` and ``text_stats``
(``config.pbtxt`` plus ``1/model.onnx`` or ``1/model.py``) under DIR, by default the folder this
script lives in. Every weight comes from a fixed seed and every file is
serialised the same way each run, so regenerating leaves the committed files
byte for byte unchanged. ``text_stats/1/model.py`` is the one file written by
hand: it is copied from this folder.

The larger models' builders sit beside this file (``cnn_builder.py``,
``stateful_gru_builder.py``), with what every model is made of
(``model_files.py``). The test helpers in ``tests/models.py`` load this file by
path and use the builders through it (``build_add_sub``, ``tensor_config``,
``write_onnx_model``...).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx import TensorProto, helper

HERE = Path(__file__).resolve().parent
# Run as a script, this folder is on sys.path already; loaded by path (tests/models.py does),
# it is added, last, so that the builders beside this file import by name.
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

from cnn_builder import CNN_MAX_BYTES, build_cnn, check_cnn, cnn_config, cnn_stats, write_labels  # noqa: E402
from model_files import (  # noqa: E402
    cpu_instances, make_onnx_model, model_config, tensor_config, value_info, write_config, write_onnx_model,
    write_python_source,
)
# onnx_gru_step and run_gru_steps are for the tests, which reach them through this module.
from stateful_gru_builder import (  # noqa: E402, F401
    GRU_MAX_BYTES, build_stateful_gru, check_stateful_gru, onnx_gru_step, run_gru_steps, stateful_gru_config,
)

TEXT_STATS_MODEL = HERE / "text_stats" / "1" / "model.py"


# --- add_sub ---------------------------------------------------------------


def build_add_sub(size: int = 16, batched: bool = True) -> onnx.ModelProto:
    fp32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
        ],
        "add_sub",
        [value_info(n, fp32, [size], batched) for n in ("INPUT0", "INPUT1")],
        [value_info(n, fp32, [size], batched) for n in ("OUTPUT0", "OUTPUT1")],
    )
    return make_onnx_model(graph)


def add_sub_config(
    name: str = "add_sub", max_batch_size: int = 8, delay_us: int = 100, instances: int = 1, size: int = 16,
) -> str:
    """Without batching (``max_batch_size`` 0) there is no dynamic batcher either."""
    batching = f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n" if max_batch_size > 0 else ""
    return model_config(
        name, 'platform: "onnxruntime_onnx"', max_batch_size,
        [tensor_config(n, "TYPE_FP32", [size]) for n in ("INPUT0", "INPUT1")],
        [tensor_config(n, "TYPE_FP32", [size]) for n in ("OUTPUT0", "OUTPUT1")],
        batching + cpu_instances(instances),
    )


def write_add_sub(repo: Path, name: str = "add_sub", max_batch_size: int = 8,
                  delay_us: int = 100, instances: int = 1) -> None:
    model_dir = repo / name
    write_onnx_model(model_dir, build_add_sub(batched=max_batch_size > 0))
    write_config(model_dir, add_sub_config(name, max_batch_size, delay_us, instances))


# --- text_stats ------------------------------------------------------------


def text_stats_config(name: str = "text_stats") -> str:
    return model_config(
        name, 'backend: "python"', 16,
        [tensor_config("TEXT", "TYPE_STRING", [1])],
        [tensor_config("UPPER", "TYPE_STRING", [1]), tensor_config("LENGTH", "TYPE_INT32", [1])],
        "dynamic_batching { }\n" + cpu_instances(1),
    )


# --- the repository --------------------------------------------------------


def check_size(path: Path, max_bytes: int) -> int:
    size = path.stat().st_size
    if size > max_bytes:
        raise SystemExit(f"{path}: {size} bytes, over the {max_bytes} byte budget")
    return size


def generate(out: Path) -> None:
    write_add_sub(out)
    cnn_path = write_onnx_model(out / "cnn", build_cnn())
    write_config(out / "cnn", cnn_config())
    write_labels(out / "cnn")
    gru_path = write_onnx_model(out / "stateful_gru", build_stateful_gru())
    write_config(out / "stateful_gru", stateful_gru_config())
    write_python_source(out / "text_stats", TEXT_STATS_MODEL.read_text(encoding="utf-8"))
    write_config(out / "text_stats", text_stats_config())
    check_cnn(cnn_path)
    check_stateful_gru(gru_path)
    stats, size = cnn_stats(), check_size(cnn_path, CNN_MAX_BYTES)
    print(f"cnn: {stats.parameters} parameters, {size} bytes, {stats.macs_per_image / 1e6:.1f}M MACs per image")
    print(f"stateful_gru: {check_size(gru_path, GRU_MAX_BYTES)} bytes")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE,
                        help="repository folder to write (default: this script's folder)")
    args = parser.parse_args(argv)
    generate(args.out)
    print(f"wrote add_sub, cnn, stateful_gru, text_stats under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
