"""Facade so user code reads as in the seed documents: ``import cann.torch``; ``cann.torch.export(...)``."""
