"""Elastic Horovod training as a user writes it, with the compressor in the state.

    horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script discover.sh \\
        python tests/workers/torch_elastic.py --out DIR --steps 30

The discovery script (the test writes it) reads ``DIR/progress``, the step
rank 0 has reached, to remove and add hosts; at the steps where the world is
to change every rank waits before its commit, so that Horovod's notification
arrives and the commit raises the restart.

Every process appends JSON lines to ``DIR/<host>.<pid>.jsonl``:
``{"event": "enter" | "commit" | "done", "step", "rank", "size", "params",
"pending"}`` -- ``enter`` when ``hvd.elastic.run`` (re)enters the training
function, ``commit`` just before ``state.commit()`` -- and
``{"event": "raised", "error"}`` for what interrupted the training function.  ``params`` is a digest of the
parameters; ``pending`` the update error feedback still owes,
``(1/P) sum_r e_r`` over the current ranks' residuals (a collective).
"""

import argparse
import hashlib
import json
import os
import socket
import time

import horovod.torch as hvd
import numpy as np
import torch

import horovod_sparse.torch as hs


def pending_update(compressor, model):
    """``(1/P) sum_r e_r`` in the model's parameter order (float64, collective)."""
    residuals = compressor.state_dict().get("residuals", {})
    flat = [np.asarray(residuals.get(name, np.zeros(p.numel())), dtype=np.float64).ravel()
            for name, p in model.named_parameters()]
    return hvd.allreduce(torch.from_numpy(np.concatenate(flat)), op=hvd.Average,
                         name="test.pending").numpy()


def digest(model):
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                   for p in model.parameters())).hexdigest()[:16]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--method", default="exdyna")
    parser.add_argument("--density", type=float, default=0.05)
    parser.add_argument("--change-at", default="10,20", help="steps where the world changes")
    args = parser.parse_args()
    change_at = {int(s) for s in args.change_at.split(",")}
    log_path = os.path.join(args.out, f"{socket.gethostname()}.{os.getpid()}.jsonl")

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    compressor = hs.Compression.create(args.method, density=args.density)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(), compression=compressor)
    state = hvd.elastic.TorchState(model, optimizer, compressor=compressor, step=0)

    def log(event, **fields):
        record = dict(event=event, step=state.step, rank=hvd.rank(), size=hvd.size(),
                      params=digest(model), pending=pending_update(compressor, model).tolist(),
                      **fields)
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def train(state):
        log("enter")
        while state.step < args.steps:
            generator = torch.Generator().manual_seed(1000 * state.step + hvd.rank())
            x = torch.randn(16, 32, generator=generator)
            y = torch.randint(0, 10, (16,), generator=generator)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            state.step += 1
            if hvd.rank() == 0:
                with open(os.path.join(args.out, "progress.tmp"), "w") as f:
                    f.write(str(state.step))
                os.replace(os.path.join(args.out, "progress.tmp"),
                           os.path.join(args.out, "progress"))
            if state.step in change_at:
                time.sleep(6)  # the driver polls discovery every second, then notifies
            log("commit", loss=float(loss.detach()))
            state.commit()

    @hvd.elastic.run
    def logged(state):
        try:
            return train(state)
        except BaseException as error:  # Horovod's restarts, and anything else
            with open(log_path, "a") as f:
                f.write(json.dumps({"event": "raised", "error": repr(error)}) + "\n")
            raise

    logged(state)
    log("done")


if __name__ == "__main__":
    main()
