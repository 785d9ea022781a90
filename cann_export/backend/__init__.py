"""Where the model runs: device selection, eval mode and (later) precision emulation and QAT."""
