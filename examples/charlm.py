"""Train a character-level LSTM language model on the Python standard library's
own source files with Horovod, dense or sparse.

    horovodrun -np 2 python examples/charlm.py --compression exdyna --density 0.01

The text needs no download: a fixed selection of the running interpreter's
standard-library modules (``TRAIN_FILES``, ``VALIDATION_FILES``; split by
file, so validation is code the model never saw).  Bytes are the characters
(vocabulary 256).  Model: embedding 64, one LSTM layer of 512, a linear
decoder: 1,331,456 parameters.  Each rank trains on random windows of the
training text (its own random stream); Horovod's ``DistributedOptimizer``
averages the gradients, densely (``--compression dense``) or through a
horovod_sparse compressor, and the step is the usual one for an LSTM:
``synchronize()``, clip the averaged gradient's norm, ``step()`` under
``skip_synchronize()``.  Validation bits per character (cross-entropy in
bits, mean over every predicted character of fixed validation windows) is
measured every ``--eval-every`` steps; the clock that goes with it counts
training steps only.
"""

import argparse
import math
import os
import sysconfig
import time

import numpy as np
import torch
import torch.nn.functional as F
import horovod.torch as hvd

from digits_common import DENSE, GOSSIP, canonical, report
from torch_training import add_compression_argument, make_optimizer, traffic_summary

TRAIN_FILES = ("argparse.py", "ast.py", "configparser.py", "dataclasses.py", "datetime.py",
               "enum.py", "functools.py", "inspect.py", "pathlib.py", "pickle.py", "shutil.py",
               "subprocess.py", "tarfile.py", "threading.py", "typing.py", "zipfile.py")
VALIDATION_FILES = ("fractions.py", "heapq.py", "textwrap.py")
VOCABULARY = 256  # bytes
VALIDATION_WINDOWS, VALIDATION_LENGTH = 64, 128


def read_corpus(files, directory=None):
    """The ``files`` of the standard library (``directory``: the running
    interpreter's) concatenated as bytes, as a uint8 array."""
    directory = directory or sysconfig.get_paths()["stdlib"]
    texts = []
    for name in files:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"the language-model corpus needs the standard library's "
                                    f"source file {path}; this Python installs no sources")
        with open(path, "rb") as f:
            texts.append(f.read())
    return np.frombuffer(bytearray(b"\n".join(texts)), dtype=np.uint8)


def validation_windows(text):
    """``VALIDATION_WINDOWS`` evenly spaced windows of ``VALIDATION_LENGTH + 1``
    characters of the validation text, as an int64 tensor (the same on every rank)."""
    starts = np.linspace(0, len(text) - VALIDATION_LENGTH - 1, VALIDATION_WINDOWS).astype(np.int64)
    return torch.from_numpy(np.stack([text[s:s + VALIDATION_LENGTH + 1] for s in starts])
                            .astype(np.int64))


class CharLSTM(torch.nn.Module):
    """Embedding -> LSTM -> linear decoder over the 256 byte values."""

    def __init__(self, embedding=64, hidden=512):
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCABULARY, embedding)
        self.lstm = torch.nn.LSTM(embedding, hidden, batch_first=True)
        self.decoder = torch.nn.Linear(hidden, VOCABULARY)

    def forward(self, characters):
        return self.decoder(self.lstm(self.embedding(characters))[0])


def bits_per_character(model, windows):
    """Mean cross-entropy in bits of predicting each next character of ``windows``."""
    model.eval()
    with torch.no_grad():
        logits = model(windows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCABULARY), windows[:, 1:].reshape(-1))
    model.train()
    return float(loss) / math.log(2)


def clipped_step(optimizer, model, clip, distributed):
    """The LSTM step as Horovod's docs write it: average the gradients, clip
    their norm, apply; a gossip optimizer clips its rank's own gradient."""
    if distributed:
        optimizer.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    if distributed:
        with optimizer.skip_synchronize():
            optimizer.step()
    else:
        optimizer.step()


def train(compression="dense", density=0.01, steps=600, batch_size=16, sequence=64, lr=3.0,
          clip=1.0, eval_every=50, seed=0, verbose=True, **options):
    """Train once; return a summary dict with the validation curve (``curve``:
    ``step``, training ``seconds`` so far, ``bpc``) of rank 0's model."""
    compression = canonical(compression)
    torch.manual_seed(seed)
    train_text = read_corpus(TRAIN_FILES)
    windows = validation_windows(read_corpus(VALIDATION_FILES))
    rank, size = hvd.rank(), hvd.size()
    model = CharLSTM()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer, compressor = make_optimizer(compression, model, density, lr, **options)
    distributed = compression not in GOSSIP
    n = sum(p.numel() for p in model.parameters())
    generator = np.random.default_rng(seed + 1 + rank)
    offsets = torch.arange(sequence + 1)
    curve, step_times, seconds = [], [], 0.0
    for step in range(steps + 1):
        if step % eval_every == 0 or step == steps:
            curve.append({"step": step, "seconds": seconds,
                          "bpc": bits_per_character(model, windows)})
            if verbose and rank == 0:
                print(f"[{compression}] step {step:5d}/{steps}  {seconds:7.1f} s  validation "
                      f"{curve[-1]['bpc']:.3f} bits/char", flush=True)
        if step == steps:
            break
        for group in optimizer.param_groups:  # cosine decay, the same for every method
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        starts = torch.from_numpy(generator.integers(0, len(train_text) - sequence - 1, batch_size))
        batch = torch.from_numpy(train_text)[starts[:, None] + offsets].long()
        start = time.perf_counter()
        optimizer.zero_grad()
        logits = model(batch[:, :-1])
        F.cross_entropy(logits.reshape(-1, VOCABULARY), batch[:, 1:].reshape(-1)).backward()
        clipped_step(optimizer, model, clip, distributed)
        step_times.append(time.perf_counter() - start)
        seconds += step_times[-1]
    times = np.array(step_times[5:] or step_times)
    summary = {"method": compression, "density_target": density if compression != DENSE else 1.0,
               "ranks": size, "parameters": n, "steps": steps, "curve": curve,
               "bpc": float(np.mean([point["bpc"] for point in curve[-2:]])),
               "characters_per_second": float(batch_size * sequence * size / times.mean()),
               "step_ms": float(1000 * times.mean())}
    summary.update(traffic_summary(compression, model, optimizer, compressor))
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_compression_argument(parser)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3.0)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--json", help="write the summary here (rank 0)")
    args = parser.parse_args()
    hvd.init(process_sets="dynamic" if args.compression == "hierarchical" else None)
    summary = train(args.compression, args.density, args.steps, args.batch_size, lr=args.lr,
                    eval_every=args.eval_every)
    if hvd.rank() == 0:
        report(summary, args.json)


if __name__ == "__main__":
    main()
