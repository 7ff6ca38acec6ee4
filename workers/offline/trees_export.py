"""Export a scikit-learn forest to a Treelite checkpoint for the ``fil`` backend.

ferry never unpickles a model: a pickle runs code when loaded. Run this where
the model was trained (or wherever you trust its pickle) and ship the
checkpoint instead, with ``model_type: "treelite_checkpoint"``:

    from workers.offline.trees_export import export_sklearn
    export_sklearn(fitted_forest, "model_repository/my_forest/1/checkpoint.tl")

or, from a pickle or joblib file you trust:

    python -m workers.offline.trees_export forest.joblib model_repository/my_forest/1/checkpoint.tl

Random forests, extra trees, gradient boosting and histogram gradient boosting
(classifiers and regressors) are what ``treelite.sklearn`` imports.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def export_sklearn(estimator: Any, checkpoint: str | Path) -> Path:
    """Write a fitted scikit-learn tree ensemble as a Treelite checkpoint."""
    import treelite.sklearn

    path = Path(checkpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    treelite.sklearn.import_model(estimator).serialize(str(path))
    return path


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Export a trusted scikit-learn pickle as a Treelite checkpoint")
    parser.add_argument("model", type=Path, help="a pickle or joblib file of a fitted forest, which you trust")
    parser.add_argument("checkpoint", type=Path, help="where checkpoint.tl goes")
    args = parser.parse_args(argv)
    import joblib  # comes with scikit-learn; it unpickles, which is why this runs offline only

    written = export_sklearn(joblib.load(args.model), args.checkpoint)
    print(f"wrote {written}")


if __name__ == "__main__":
    main()
