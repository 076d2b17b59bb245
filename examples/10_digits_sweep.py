"""A real-input sweep: tune an SVM on the ``digits`` data set that ships inside scikit-learn
(1,797 8×8 images of handwritten digits), one cross-validated fit per task.

    pip install 'durably[examples]'                 # scikit-learn
    python examples/10_digits_sweep.py              # 6 fits in parallel, then the best one
    python examples/10_digits_sweep.py              # again: nothing is fitted
    python examples/10_digits_sweep.py --grid wide  # a bigger grid: only the new fits run

Each fit is a step of the run, so a sweep killed halfway continues with the fits it had not
finished; and each is cached by its code, its parameters and the data's digest (numpy arrays
are hashed in place), so another sweep that shares fits (``--grid wide``) reuses them.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

try:
    import numpy as np
    import sklearn  # noqa: F401 - (imported where it is used; here: said at once if missing)
except ImportError:  # (the first README command installs durably alone)
    raise SystemExit("this example needs numpy and scikit-learn: pip install -e '.[examples]'"
                     ) from None

import durably

GRIDS = {
    "small": [{"C": c, "gamma": g} for c in (1.0, 10.0) for g in (0.0005, 0.001, 0.005)],
    "wide": [{"C": c, "gamma": g} for c in (0.5, 1.0, 10.0)
             for g in (0.0005, 0.001, 0.005)],
}


@durably.task
def load_data(test_size: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                     np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=test_size, random_state=seed, stratify=y)
    return X_train, X_test, y_train, y_test


@durably.task
def cross_validate(params: dict[str, float], X: np.ndarray, y: np.ndarray) -> float:
    """One fit per task: the mean 3-fold cross-validated accuracy of an SVM."""
    from sklearn.model_selection import cross_val_score
    from sklearn.svm import SVC

    return float(cross_val_score(SVC(**params), X, y, cv=3).mean())


@durably.task
def test_accuracy(params: dict[str, float], X_train: np.ndarray, y_train: np.ndarray,
                  X_test: np.ndarray, y_test: np.ndarray) -> float:
    from sklearn.svm import SVC

    return float(SVC(**params).fit(X_train, y_train).score(X_test, y_test))


@durably.entrypoint
def sweep(grid: list[dict[str, float]], test_size: float = 0.25, seed: int = 0
          ) -> dict[str, Any]:
    X_train, X_test, y_train, y_test = load_data(test_size, seed)
    n = len(grid)
    scores = cross_validate.map(grid, [X_train] * n, [y_train] * n, max_workers=2)
    best = max(range(n), key=lambda i: scores[i])
    return {
        "scores": [(p, round(s, 4)) for p, s in zip(grid, scores, strict=True)],
        "best_params": grid[best],
        "best_cv_accuracy": round(scores[best], 4),
        "test_accuracy": round(test_accuracy(grid[best], X_train, y_train, X_test, y_test), 4),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--grid", choices=sorted(GRIDS), default="small")
    args = parser.parse_args()

    started = time.perf_counter()
    run = sweep.run(GRIDS[args.grid])
    took = time.perf_counter() - started
    result = run.result
    for params, score in result["scores"]:
        print(f"  C={params['C']:<5} gamma={params['gamma']:<7} cv accuracy {score:.4f}")
    print(f"best params: {result['best_params']} (cv accuracy {result['best_cv_accuracy']:.4f},"
          f" test accuracy {result['test_accuracy']:.4f})")
    fits = sum(1 for s in run.steps if s.task == "cross_validate" and s.status == "ran")
    print(f"{fits} of {len(GRIDS[args.grid])} fits executed in {took:.2f} s")
    print(run.summary())
