"""Rank program: train the digits MLP densely and with each given method; rank 0 writes JSON."""

import json
import os
import sys

import horovod.torch as hvd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from digits import train  # noqa: E402


def main():
    out, density, epochs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    methods = sys.argv[4].split(",")
    hvd.init()
    results = [train(method, density, epochs=epochs, verbose=False) for method in methods]
    if hvd.rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
