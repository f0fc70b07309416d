"""Errors raised identically on every rank, so no rank is left waiting in a collective."""


class HorovodSparseError(RuntimeError):
    """Base class of the errors below."""


class ModelMismatchError(HorovodSparseError):
    """Ranks hold different models (parameter names, shapes or dtypes differ)."""


class ConfigurationMismatchError(HorovodSparseError):
    """Ranks run different methods, hyper-parameters, densities, non-finite
    policies or reductions."""

    def __init__(self, rank, configuration, ranks):
        self.rank, self.configuration, self.ranks = rank, configuration, list(ranks)
        super().__init__(f"rank {rank}'s compression ({configuration}) differs from rank(s) "
                         f"{self.ranks}: every rank must create the same compressor (method, "
                         "density, hyper-parameters, nonfinite) and use the same Horovod op")


class NonFiniteGradientError(HorovodSparseError, FloatingPointError):
    """A gradient holds NaN or Inf on at least one rank."""

    def __init__(self, ranks, step):
        """``ranks``: which ranks' gradients are not finite (``None``: unknown, as in a
        dense fallback step, where only the ranks' sum is seen)."""
        self.ranks, self.step = (None if ranks is None else list(ranks)), step
        where = "on some rank" if ranks is None else f"on rank(s) {self.ranks}"
        super().__init__(f"non-finite (NaN/Inf) gradient {where} at step {step}; "
                         "the residuals are left as before this step")


class ParameterDivergenceError(HorovodSparseError):
    """Ranks that should hold identical parameters do not."""

    def __init__(self, name, ranks):
        self.name, self.ranks = name, list(ranks)
        super().__init__(f"parameter {name!r} differs between ranks: rank(s) {self.ranks} "
                         "disagree with rank 0")
