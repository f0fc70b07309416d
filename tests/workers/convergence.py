"""Rank program: train the digits MLP densely and with each given method; rank 0
reports ``results`` to ``out`` (``records.report``)."""

import os
import sys

import horovod.torch as hvd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from digits import train  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from records import report  # noqa: E402


def main():
    out, density, epochs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    methods = sys.argv[4].split(",")
    hvd.init()
    results = [train(method, density, epochs=epochs, verbose=False) for method in methods]
    if hvd.rank() == 0:
        report(out, 0, results=results)


if __name__ == "__main__":
    main()
