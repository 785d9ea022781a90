"""Validators: numeric parity of the written graph against PyTorch, and (later) the ATC lint."""
