"""titan_morph: straggler-resilient pipeline parallelism for TorchTitan (PipeMorph, NSDI'26)."""

__version__ = "0.1.0"
