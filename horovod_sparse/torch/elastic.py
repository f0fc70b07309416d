"""The compressor in Horovod elastic training::

    compressor = Compression.exdyna(density=0.001)
    optimizer = hvd.DistributedOptimizer(optimizer, compression=compressor)
    state = hvd.elastic.TorchState(model, optimizer, compressor=compressor, epoch=0)

Importing ``horovod_sparse.torch`` registers :class:`CompressorStateHandler`
in Horovod's PyTorch state-handler registry, so a :class:`SparseCompressor`
given to ``TorchState`` takes part in ``commit`` / ``restore`` / ``sync`` like
the model and the optimizer -- but per rank, as ``core.elastic`` explains:
a restart with the same workers resumes each rank's own state, any other
carries the committed mean of the residuals over (the pending update is kept).
A compressor left out of the elastic state raises at the first step after a
restart instead of running with the old world's state.
"""

from horovod.torch.elastic.state import StateHandler, get_handler_registry, set_handler_registry

from .compression import SparseCompressor


class CompressorStateHandler(StateHandler):
    """Horovod's ``StateHandler`` for a :class:`SparseCompressor`."""

    def __init__(self, compressor):
        super().__init__(compressor)
        compressor.elastic_begin()

    def save(self):
        self.value.elastic_commit()

    def restore(self):
        self.value.elastic_restore()

    def sync(self):
        self.value.elastic_sync()


def register():
    """Put the handler first in Horovod's registry (once)."""
    registry = get_handler_registry()
    if all(handler is not CompressorStateHandler for _, handler in registry):
        set_handler_registry([(SparseCompressor, CompressorStateHandler), *registry])
